//! The HTTP routes: OpenAI's chat and text completions (whole or streamed as server-sent
//! events), the model list, health and metrics.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use model::{GenerationStats, StopReason};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::engine::{Engine, Event, Job};
use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::request::{self, Endpoint};

/// The router over `engine`.
pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model_by_id))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|uri: Uri| async move { ApiError::not_found(uri.path()) })
        .with_state(engine)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn model_card(engine: &Engine) -> Value {
    json!({
        "id": engine.model_id(),
        "object": "model",
        "created": 0,
        "owned_by": "cubellm",
        "max_model_len": engine.max_len(),
    })
}

async fn models(State(engine): State<Arc<Engine>>) -> Json<Value> {
    Json(json!({ "object": "list", "data": [model_card(&engine)] }))
}

async fn model_by_id(
    State(engine): State<Arc<Engine>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id == engine.model_id() {
        Ok(Json(model_card(&engine)))
    } else {
        Err(ApiError::unknown_model(&id, engine.model_id()))
    }
}

async fn health(State(engine): State<Arc<Engine>>) -> Response {
    if engine.is_alive() {
        Json(json!({ "status": "ok" })).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "engine stopped" })),
        )
            .into_response()
    }
}

async fn metrics(State(engine): State<Arc<Engine>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        engine.metrics().render(),
    )
        .into_response()
}

async fn chat_completions(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    complete(engine, Endpoint::Chat, &body).await
}

async fn completions(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    complete(engine, Endpoint::Completion, &body).await
}

/// `chatcmpl-…` / `cmpl-…`: unique within the process.
fn response_id(endpoint: Endpoint) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    format!("{prefix}-{:x}{n:06x}", now_secs())
}

fn finish_reason(reason: &StopReason) -> &'static str {
    match reason {
        StopReason::Eos(_) | StopReason::StopString(_) => "stop",
        StopReason::MaxNewTokens | StopReason::ContextFull => "length",
        // Not seen by a client (it is gone), but a value is needed.
        StopReason::Cancelled => "stop",
    }
}

fn usage(stats: &GenerationStats) -> Value {
    json!({
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": { "cached_tokens": stats.cached_prompt_tokens },
    })
}

/// What every response of one request shares.
struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": choices,
        })
    }

    /// The whole answer.
    fn full(&self, text: String, stats: &GenerationStats) -> Value {
        let finish = finish_reason(&stats.stop_reason);
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": Value::Null,
                "finish_reason": finish,
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": Value::Null,
                "finish_reason": finish,
            }),
        };
        let mut body = self.envelope(false, json!([choice]));
        body["usage"] = usage(stats);
        body
    }

    /// One streamed piece; `finish` on the last.
    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({ "index": 0, "delta": delta, "logprobs": Value::Null, "finish_reason": finish })
            }
            Endpoint::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": Value::Null,
                "finish_reason": finish,
            }),
        };
        self.envelope(true, json!([choice]))
    }
}

async fn complete(engine: Arc<Engine>, endpoint: Endpoint, body: &[u8]) -> Response {
    let parsed = match request::parse(&engine, endpoint, body) {
        Ok(p) => p,
        Err(e) => {
            engine.metrics().record(Outcome::Rejected);
            return e.into_response();
        }
    };
    let (events_tx, events) = mpsc::unbounded_channel();
    let job = Job {
        prompt: parsed.prompt,
        options: parsed.options,
        events: events_tx,
    };
    if let Err(e) = engine.submit(job) {
        engine.metrics().record(Outcome::Overloaded);
        return e.into_response();
    }
    let reply = Reply {
        endpoint,
        id: response_id(endpoint),
        created: now_secs(),
        model: engine.model_id().to_string(),
    };
    if parsed.stream {
        let stream = sse_stream(reply, events, parsed.include_usage);
        Sse::new(stream).into_response()
    } else {
        collect(reply, events).await
    }
}

/// Waits for the whole answer. If the client goes away, this future is dropped with the
/// receiver, which stops the engine at its next token.
async fn collect(reply: Reply, mut events: mpsc::UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Done(stats) => return Json(reply.full(text, &stats)).into_response(),
            Event::Failed(e) => return ApiError::internal(e).into_response(),
        }
    }
    ApiError::unavailable("the engine stopped before the answer was complete").into_response()
}

/// The answer as server-sent events: a first chunk with the role (chat), one chunk per piece of
/// text, a last chunk with the finish reason, the usage chunk when asked for, then `[DONE]`.
fn sse_stream(
    reply: Reply,
    events: mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let data = |v: Value| SseEvent::default().data(v.to_string());
    let mut pending = VecDeque::new();
    if reply.endpoint == Endpoint::Chat {
        pending.push_back(data(reply.chunk(Some(""), true, None)));
    }
    let state = (reply, events, pending, false);
    stream::unfold(
        state,
        move |(reply, mut events, mut pending, mut finished)| async move {
            loop {
                if let Some(e) = pending.pop_front() {
                    return Some((Ok(e), (reply, events, pending, finished)));
                }
                if finished {
                    return None;
                }
                match events.recv().await {
                    Some(Event::Text(t)) => {
                        pending.push_back(data(reply.chunk(Some(&t), false, None)))
                    }
                    Some(Event::Done(stats)) => {
                        let finish = finish_reason(&stats.stop_reason);
                        pending.push_back(data(reply.chunk(None, false, Some(finish))));
                        if include_usage {
                            let mut u = reply.envelope(true, json!([]));
                            u["usage"] = usage(&stats);
                            pending.push_back(data(u));
                        }
                        pending.push_back(SseEvent::default().data("[DONE]"));
                        finished = true;
                    }
                    Some(Event::Failed(e)) => {
                        pending.push_back(data(ApiError::internal(e).body()));
                        pending.push_back(SseEvent::default().data("[DONE]"));
                        finished = true;
                    }
                    None => {
                        let e = ApiError::unavailable(
                            "the engine stopped before the answer was complete",
                        );
                        pending.push_back(data(e.body()));
                        pending.push_back(SseEvent::default().data("[DONE]"));
                        finished = true;
                    }
                }
            }
        },
    )
}
