//! An OpenAI-compatible HTTP server over a cubellm model.
//!
//! ```text
//! POST /v1/chat/completions   messages → answer (whole, or streamed as server-sent events)
//! POST /v1/completions        prompt → continuation (same)
//! GET  /v1/models             the one model served
//! GET  /health                200 while the engine runs
//! GET  /metrics               Prometheus text: requests by outcome, tokens, queue depth, speed
//! ```
//!
//! [`Engine`] owns the model on its own thread and generates for one request at a time, in
//! arrival order, from a bounded queue; the HTTP side (axum on tokio) checks and tokenizes
//! requests, queues them, and streams the engine's text back. A client that disconnects stops
//! its generation at the next token. Errors use OpenAI's JSON shape and status codes.
//!
//! ```text
//! engine.rs    Engine: the model's thread, the queue, cancellation
//! request.rs   the request body → prompt tokens and generation options (400s name the field)
//! routes.rs    the axum router, responses and server-sent events
//! error.rs     ApiError: OpenAI's error shape
//! metrics.rs   counters and their Prometheus rendering
//! ```

pub mod engine;
pub mod error;
pub mod metrics;
pub mod request;
pub mod routes;

use std::future::Future;
use std::sync::Arc;

pub use engine::{Engine, EngineOptions};
pub use error::ApiError;
pub use routes::router;

/// Serves `engine` on `listener` until `shutdown` completes; then stops accepting connections,
/// lets the requests in flight (and those queued) finish, and stops the engine.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(engine.clone());
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    let stopping = engine.clone();
    // Joining the engine thread blocks: keep it off the async workers.
    let _ = tokio::task::spawn_blocking(move || stopping.shutdown()).await;
    served
}
