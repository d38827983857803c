//! The engine: one thread that owns the model and decodes the running requests together
//! (continuous batching), fed by a bounded queue.
//!
//! Every device call of the model happens on this thread (it also loads the model), so HTTP
//! handlers never touch the device and a CUDA graph capture never races another thread's work.
//!
//! Up to the model's `max_batch` requests run at once, each in its own KV-cache slot. Between two
//! decode steps the scheduler admits waiting requests into free slots (prefilling each one's
//! prompt and choosing its first token), then one batched step decodes the next token of every
//! running request; a request that ends (eos, a stop string, `max_tokens`, a full context, or a
//! client that went away) frees its slot for the next. Requests are admitted in arrival order;
//! the queue holds at most `max_waiting` requests that have no slot yet, and a request beyond
//! that is refused at once (HTTP 503) rather than left to wait without bound.
//!
//! A request's text does not depend on what it is batched with: each one has its own sampler
//! and seed, and the batched step computes each sequence as it would alone (see
//! [`model::BatchSession`]).
//!
//! Greedy requests take the step's device argmax; sampled ones are sampled here on the host
//! from the step's logits (read back whenever one of the running requests samples), unlike a
//! single [`model::Session`], which samples on the device. The host sampler draws as the device
//! one does (same seeded uniforms, kept ids in ascending order), so a request's text is the
//! same as `generate`'s for the same seed up to rounding.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use model::{
    BatchLm, GenerateOptions, GenerationConfig, GenerationStats, ModelError, Sequence, StopReason,
    Tokenizer,
};
use tokio::sync::mpsc as async_mpsc;

use crate::error::ApiError;
use crate::metrics::{Metrics, Outcome};

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The name clients use in `model` (and `/v1/models` lists).
    pub model_id: String,
    /// Requests that may wait for a free slot before new ones are refused.
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
        M: BatchLm + 'static,
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
                let mut model = model;
                Scheduler::new(&mut model, &worker_tokenizer, &worker_metrics).run(&job_rx);
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

/// A running request: its slot, its generation state, where its text goes, and the token the
/// next step decodes.
struct Running<'t> {
    slot: usize,
    seq: Sequence<'t>,
    events: async_mpsc::UnboundedSender<Event>,
    next: u32,
}

/// The text callback of a request: a closed channel (the client went away) stops it.
fn sender(events: &async_mpsc::UnboundedSender<Event>) -> impl FnMut(&str) -> ControlFlow<()> + '_ {
    move |piece: &str| match events.send(Event::Text(piece.to_string())) {
        Ok(()) => ControlFlow::Continue(()),
        Err(_) => ControlFlow::Break(()),
    }
}

/// The scheduler of the engine thread (see the module docs).
struct Scheduler<'a, 't, M: BatchLm> {
    model: &'a mut M,
    tokenizer: &'t Tokenizer,
    metrics: &'a Metrics,
    running: Vec<Running<'t>>,
    free: Vec<usize>,
    logits: Vec<f32>,
}

impl<'a, 't, M: BatchLm> Scheduler<'a, 't, M> {
    fn new(model: &'a mut M, tokenizer: &'t Tokenizer, metrics: &'a Metrics) -> Self {
        let free = (0..model.max_batch()).rev().collect();
        Self {
            model,
            tokenizer,
            metrics,
            running: Vec::new(),
            free,
            logits: Vec::new(),
        }
    }

    /// Serves until the queue is closed and every request has ended.
    fn run(mut self, jobs: &mpsc::Receiver<Job>) {
        let mut open = true;
        loop {
            // Admit waiting requests into free slots; block for one when nothing runs.
            while open && !self.free.is_empty() {
                let job = if self.running.is_empty() {
                    jobs.recv().map_err(|_| TryRecvError::Disconnected)
                } else {
                    jobs.try_recv()
                };
                match job {
                    Ok(job) => {
                        self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                        self.admit(job);
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if self.running.is_empty() {
                if open {
                    continue;
                }
                return;
            }
            self.step();
        }
    }

    /// Prefills a request into a free slot and takes its first token.
    fn admit(&mut self, job: Job) {
        if job.events.is_closed() {
            self.metrics.record(Outcome::Cancelled);
            return;
        }
        let Some(slot) = self.free.pop() else {
            // `run` admits only while a slot is free.
            let _ = job.events.send(Event::Failed("no free slot".into()));
            self.metrics.record(Outcome::Failed);
            return;
        };
        let max_len = self.model.max_len();
        let started = Sequence::with_context(self.tokenizer, job.prompt, &job.options, max_len)
            .and_then(|mut seq| {
                if job.options.max_new_tokens == 0 {
                    return Ok((seq, None));
                }
                let prompt = seq.prompt_tokens().to_vec();
                if prompt.is_empty() || prompt.len() > max_len {
                    return Err(ModelError::ContextOverflow {
                        needed: prompt.len(),
                        max_len,
                    });
                }
                self.model.prefill(slot, &prompt)?;
                let token = if seq.greedy_on_device() {
                    self.model.prefill_argmax()?
                } else {
                    self.model.prefill_logits(&mut self.logits)?;
                    seq.sample(&mut self.logits)?
                };
                seq.first_token_chosen();
                Ok((seq, Some(token)))
            });
        self.metrics.running.fetch_add(1, Ordering::Relaxed);
        match started {
            Ok((seq, None)) => {
                let events = job.events;
                self.end(slot, seq, &events, StopReason::MaxNewTokens);
            }
            Ok((seq, Some(token))) => {
                let mut running = Running {
                    slot,
                    seq,
                    events: job.events,
                    next: token,
                };
                match self.take(&mut running, token) {
                    Ok(Some(reason)) => {
                        self.end(running.slot, running.seq, &running.events, reason)
                    }
                    Ok(None) => self.running.push(running),
                    Err(e) => self.fail(running.slot, &running.events, &e),
                }
            }
            Err(e) => self.fail(slot, &job.events, &e),
        }
    }

    /// Hands the chosen `token` to a request; returns why it ends, if it does.
    fn take(&mut self, r: &mut Running<'t>, token: u32) -> model::Result<Option<StopReason>> {
        let len = self.model.slot_len(r.slot);
        r.next = token;
        r.seq.push(token, len, &mut sender(&r.events))
    }

    /// One batched decode step over every running request.
    fn step(&mut self) {
        // Requests whose client left end before the step.
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                let r = self.running.swap_remove(i);
                self.end(r.slot, r.seq, &r.events, StopReason::Cancelled);
            } else {
                i += 1;
            }
        }
        if self.running.is_empty() {
            return;
        }
        let rows: Vec<(usize, u32)> = self.running.iter().map(|r| (r.slot, r.next)).collect();
        let sampled = self.running.iter().any(|r| !r.seq.greedy_on_device());
        self.metrics.decode_step(rows.len());
        let chosen = self.model.decode(&rows).and_then(|()| {
            let ids = self.model.decode_argmax()?;
            if sampled {
                self.model.decode_logits(&mut self.logits)?;
            }
            Ok(ids)
        });
        let ids = match chosen {
            Ok(ids) => ids,
            Err(e) => {
                for r in std::mem::take(&mut self.running) {
                    self.fail(r.slot, &r.events, &e);
                }
                return;
            }
        };
        let vocab = self.model.vocab_size();
        let mut still = Vec::with_capacity(self.running.len());
        let running = std::mem::take(&mut self.running);
        for (row, mut r) in running.into_iter().enumerate() {
            let token = if r.seq.greedy_on_device() {
                Ok(ids[row])
            } else {
                let logits = &mut self.logits[row * vocab..(row + 1) * vocab];
                r.seq.sample(logits)
            };
            match token.and_then(|token| self.take(&mut r, token)) {
                Ok(Some(reason)) => self.end(r.slot, r.seq, &r.events, reason),
                Ok(None) => still.push(r),
                Err(e) => self.fail(r.slot, &r.events, &e),
            }
        }
        self.running = still;
    }

    /// A request ended: its last text and statistics go out, its slot is freed.
    fn end(
        &mut self,
        slot: usize,
        seq: Sequence<'t>,
        events: &async_mpsc::UnboundedSender<Event>,
        reason: StopReason,
    ) {
        self.release(slot);
        match seq.finish(reason, &mut sender(events)) {
            Ok(output) => {
                self.metrics.generation(&output.stats);
                let cancelled = output.stats.stop_reason == StopReason::Cancelled;
                // A client that left after the last piece is still told nothing: its channel is
                // closed, and the request counts as cancelled.
                if events.send(Event::Done(output.stats)).is_err() || cancelled {
                    self.metrics.record(Outcome::Cancelled);
                } else {
                    self.metrics.record(Outcome::Completed);
                }
            }
            Err(e) => {
                self.metrics.record(Outcome::Failed);
                let _ = events.send(Event::Failed(e.to_string()));
            }
        }
    }

    fn fail(&mut self, slot: usize, events: &async_mpsc::UnboundedSender<Event>, e: &ModelError) {
        self.release(slot);
        self.metrics.record(Outcome::Failed);
        let _ = events.send(Event::Failed(e.to_string()));
    }

    fn release(&mut self, slot: usize) {
        self.model.release(slot);
        self.free.push(slot);
        self.metrics.running.fetch_sub(1, Ordering::Relaxed);
    }
}
