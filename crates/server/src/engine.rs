//! The engine: one thread that owns the model and generates for one request at a time, fed by a
//! bounded queue.
//!
//! Every device call of the model happens on this thread (it also loads the model), so HTTP
//! handlers never touch the device and a CUDA graph capture never races another thread's work.
//! Requests are served in arrival order; the queue holds at most `max_waiting` requests behind
//! the running one, and a request beyond that is refused at once (HTTP 503) rather than left
//! to wait without bound.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use model::{
    CausalLm, GenerateOptions, GenerationConfig, GenerationStats, Generator, ModelError, Prompt,
    StopReason, Tokenizer,
};
use tokio::sync::mpsc as async_mpsc;

use crate::error::ApiError;
use crate::metrics::{Metrics, Outcome};

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The name clients use in `model` (and `/v1/models` lists).
    pub model_id: String,
    /// Requests that may wait behind the running one before new ones are refused.
    pub max_waiting: usize,
}

/// What the engine sends back for one request.
#[derive(Debug)]
pub enum Event {
    /// The next piece of text (whole characters, never part of a stop string).
    Text(String),
    /// Generation ended.
    Done(GenerationStats),
    /// Generation failed (after zero or more pieces of text).
    Failed(String),
}

/// One request for the engine.
pub struct Job {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub events: async_mpsc::UnboundedSender<Event>,
}

/// A running engine: the queue's sending end and what the HTTP side needs to check a request
/// before queueing it.
pub struct Engine {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    tokenizer: Tokenizer,
    generation: GenerationConfig,
    options: EngineOptions,
    max_len: usize,
    metrics: Arc<Metrics>,
}

impl Engine {
    /// Starts the engine thread, which builds the model with `make` (loading it onto the
    /// device) and then serves jobs. Returns once the model is ready, or with `make`'s error.
    pub fn start<M, F>(
        options: EngineOptions,
        tokenizer: Tokenizer,
        generation: GenerationConfig,
        make: F,
    ) -> model::Result<Arc<Self>>
    where
        M: CausalLm + 'static,
        F: FnOnce() -> model::Result<M> + Send + 'static,
    {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<model::Result<usize>>();
        let metrics = Arc::new(Metrics::default());
        let worker_metrics = metrics.clone();
        let worker_tokenizer = tokenizer.clone();
        let worker = std::thread::Builder::new()
            .name("cubellm-engine".into())
            .spawn(move || {
                let model = match make() {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(model.max_len()));
                // No prefix reuse: a request's answer must not depend on the request before it
                // (a prefill split in two rounds differently), so that a seed gives the same
                // text whatever else the server is doing.
                let mut generator = Generator::new(model, worker_tokenizer);
                while let Ok(job) = job_rx.recv() {
                    worker_metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    run_job(&mut generator, job, &worker_metrics);
                }
            })
            .map_err(|e| ModelError::InvalidParameter {
                name: "engine",
                detail: format!("cannot start its thread: {e}"),
            })?;
        let max_len = match ready_rx.recv() {
            Ok(Ok(max_len)) => max_len,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(ModelError::InvalidParameter {
                    name: "engine",
                    detail: "its thread ended while loading the model".into(),
                })
            }
        };
        Ok(Arc::new(Self {
            jobs: Mutex::new(Some(job_tx)),
            worker: Mutex::new(Some(worker)),
            tokenizer,
            generation,
            options,
            max_len,
            metrics,
        }))
    }

    pub fn model_id(&self) -> &str {
        &self.options.model_id
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// Positions the model's context holds.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether the engine thread is still serving.
    pub fn is_alive(&self) -> bool {
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        worker.as_ref().is_some_and(|w| !w.is_finished())
    }

    /// Queues a job, or refuses it when `max_waiting` jobs already wait.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let waiting = self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
        if waiting >= self.options.max_waiting as u64 {
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::queue_full(self.options.max_waiting));
        }
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let sent = jobs.as_ref().map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(ApiError::unavailable(
                "the engine is not running (it failed or the server is shutting down)",
            ));
        }
        Ok(())
    }

    /// Stops taking jobs, lets the engine finish those queued, and waits for its thread.
    pub fn shutdown(&self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(worker) = worker {
            let _ = worker.join();
        }
    }
}

/// Generates for one job, sending its text as it comes; a closed event channel (the client
/// went away) stops generation at the next token.
fn run_job<M: CausalLm>(generator: &mut Generator<M>, job: Job, metrics: &Metrics) {
    if job.events.is_closed() {
        metrics.record(Outcome::Cancelled);
        return;
    }
    metrics.running.fetch_add(1, Ordering::Relaxed);
    let events = &job.events;
    let result = generator.generate(
        &Prompt::Tokens(job.prompt),
        &job.options,
        |piece| match events.send(Event::Text(piece.to_string())) {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        },
    );
    metrics.running.fetch_sub(1, Ordering::Relaxed);
    match result {
        Ok(output) => {
            metrics.generation(&output.stats);
            let cancelled = output.stats.stop_reason == StopReason::Cancelled;
            // A client that left after the last piece is still told nothing: its channel is
            // closed, and the request counts as cancelled.
            if events.send(Event::Done(output.stats)).is_err() || cancelled {
                metrics.record(Outcome::Cancelled);
            } else {
                metrics.record(Outcome::Completed);
            }
        }
        Err(e) => {
            metrics.record(Outcome::Failed);
            let _ = events.send(Event::Failed(e.to_string()));
        }
    }
}
