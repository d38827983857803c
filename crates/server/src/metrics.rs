//! Counters for `GET /metrics`, in Prometheus' text exposition format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// How a completion request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// The client went away before the end.
    Cancelled,
    /// A bad request (4xx).
    Rejected,
    /// Refused because the queue was full (503).
    Overloaded,
    /// Generation failed (5xx).
    Failed,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Completed,
        Outcome::Cancelled,
        Outcome::Rejected,
        Outcome::Overloaded,
        Outcome::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::Rejected => "rejected",
            Outcome::Overloaded => "overloaded",
            Outcome::Failed => "failed",
        }
    }
}

#[derive(Debug, Default)]
pub struct Metrics {
    outcomes: [AtomicU64; 5],
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Requests admitted and not yet picked up by the engine.
    pub(crate) waiting: AtomicU64,
    /// Requests the engine is generating for.
    pub(crate) running: AtomicU64,
    /// Batched decode steps, the sequences they decoded, and the most in one step.
    decode_steps: AtomicU64,
    decode_rows: AtomicU64,
    decode_batch_max: AtomicU64,
    timings: Mutex<Timings>,
}

#[derive(Debug, Default)]
struct Timings {
    generation_seconds: f64,
    ttft_seconds_sum: f64,
    ttft_count: u64,
    last_decode_tokens_per_second: f64,
}

impl Metrics {
    pub fn record(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.outcomes[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self, outcome: Outcome) -> u64 {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.outcomes[i].load(Ordering::Relaxed)
    }

    /// One finished generation (completed or cancelled).
    pub(crate) fn generation(&self, stats: &model::GenerationStats) {
        self.prompt_tokens
            .fetch_add(stats.prompt_tokens as u64, Ordering::Relaxed);
        self.generated_tokens
            .fetch_add(stats.generated_tokens as u64, Ordering::Relaxed);
        let mut t = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        t.generation_seconds += (stats.prefill_time + stats.decode_time).as_secs_f64();
        if stats.generated_tokens > 0 {
            t.ttft_seconds_sum += stats.time_to_first_token.as_secs_f64();
            t.ttft_count += 1;
        }
        if stats.generated_tokens > 1 {
            t.last_decode_tokens_per_second = stats.decode_tokens_per_sec();
        }
    }

    /// One batched decode step of `rows` sequences.
    pub(crate) fn decode_step(&self, rows: usize) {
        self.decode_steps.fetch_add(1, Ordering::Relaxed);
        self.decode_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.decode_batch_max
            .fetch_max(rows as u64, Ordering::Relaxed);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, values: &[(String, f64)]| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} {kind}");
            for (labels, v) in values {
                let _ = writeln!(s, "{name}{labels} {v}");
            }
        };
        let outcomes: Vec<(String, f64)> = Outcome::ALL
            .iter()
            .map(|o| {
                (
                    format!("{{outcome=\"{}\"}}", o.label()),
                    self.count(*o) as f64,
                )
            })
            .collect();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        metric(
            "cubellm_requests_total",
            "counter",
            "Completion requests by how they ended.",
            &outcomes,
        );
        metric(
            "cubellm_prompt_tokens_total",
            "counter",
            "Prompt tokens of the requests generated for.",
            &[(String::new(), load(&self.prompt_tokens))],
        );
        metric(
            "cubellm_generated_tokens_total",
            "counter",
            "Tokens generated.",
            &[(String::new(), load(&self.generated_tokens))],
        );
        metric(
            "cubellm_queue_depth",
            "gauge",
            "Requests waiting for the engine.",
            &[(String::new(), load(&self.waiting))],
        );
        metric(
            "cubellm_requests_running",
            "gauge",
            "Requests being generated for.",
            &[(String::new(), load(&self.running))],
        );
        metric(
            "cubellm_decode_steps_total",
            "counter",
            "Batched decode steps (each decodes one token of every running request).",
            &[(String::new(), load(&self.decode_steps))],
        );
        metric(
            "cubellm_decode_sequences_total",
            "counter",
            "Sequences decoded by those steps (divided by the steps: the mean batch).",
            &[(String::new(), load(&self.decode_rows))],
        );
        metric(
            "cubellm_decode_batch_max",
            "gauge",
            "The most sequences one decode step has decoded together.",
            &[(String::new(), load(&self.decode_batch_max))],
        );
        let t = self.timings.lock().unwrap_or_else(|e| e.into_inner());
        metric(
            "cubellm_generation_seconds_total",
            "counter",
            "Seconds requests spent generating, prefill and decode (concurrent requests overlap).",
            &[(String::new(), t.generation_seconds)],
        );
        metric(
            "cubellm_time_to_first_token_seconds",
            "summary",
            "From the start of a request's prefill to its first token.",
            &[
                ("_sum".to_string(), t.ttft_seconds_sum),
                ("_count".to_string(), t.ttft_count as f64),
            ],
        );
        metric(
            "cubellm_decode_tokens_per_second",
            "gauge",
            "Decode speed of the last request that decoded more than one token.",
            &[(String::new(), t.last_decode_tokens_per_second)],
        );
        s
    }
}
