//! `cubellm serve`: the OpenAI-compatible HTTP server (the `server` crate) over a model loaded
//! like `generate` loads it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use cubecl::prelude::*;
use model::{BatchLm, BatchSession, SlotCache};
use server::{Engine, EngineOptions};

use crate::interrupt;
use crate::load::{self, ModelArgs, ModelFiles};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests decoded together (continuous batching), each with its own KV cache of the
    /// model's context (`--max-len`): 1 to 16.
    #[arg(long, default_value_t = 16)]
    pub max_batch: usize,
    /// Requests that may wait for a free slot; more are refused with HTTP 503.
    #[arg(long, default_value_t = 64)]
    pub queue_size: usize,
    /// The model name clients pass as `model` (default: the repo id or directory name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// The name a model is served under: the Hugging Face repo id it was named by, else its
/// directory's name; without `--model`, the default repo's id or `cubellm-demo` (the two models
/// `generate` falls back to).
fn default_model_name(args: &ModelArgs, files: &ModelFiles) -> String {
    match &args.model {
        None if files.dir.ends_with(model::demo::DEMO_VERSION) => "cubellm-demo".into(),
        None => model::hub::DEFAULT_REPO.into(),
        Some(spec) if !std::path::Path::new(spec).exists() => spec.clone(),
        Some(_) => files
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into()),
    }
}

pub fn serve<R: Runtime>(client: &ComputeClient<R>, args: &ServeArgs) -> anyhow::Result<()> {
    let files = ModelFiles::read(&args.model)?;
    let model_id = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_model_name(&args.model, &files));
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // Bind first: a port in use is reported before minutes of loading.
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local: SocketAddr = listener.local_addr()?;

    anyhow::ensure!(
        !args.model.weights.screen_lm_head,
        "--screen-lm-head screens one-sequence greedy decoding (generate, chat, bench-generate); \
         the server decodes its sequences in batches"
    );
    let decode = args.model.weights.quant_decode.as_str();
    if matches!(decode, "float" | "float-simt") {
        eprintln!(
            "note: the server decodes its sequences in batches whose products give each row \
             the result it gets alone, which the float-activation kernels do not: \
             --quant-decode {decode} does not apply here (the 8-bit layers decode on quantized \
             activations)"
        );
    }
    let tokenizer = files.tokenizer.clone();
    let generation = files.generation.clone();
    let (client, model_args, max_batch) = (client.clone(), args.model.clone(), args.max_batch);
    if !(1..=model::BatchBuffers::<R>::MAX_ROWS).contains(&max_batch) {
        anyhow::bail!(
            "--max-batch must be 1 to {}, not {max_batch}",
            model::BatchBuffers::<R>::MAX_ROWS
        );
    }
    let engine = Engine::start(
        EngineOptions {
            model_id: model_id.clone(),
            max_waiting: args.queue_size,
        },
        tokenizer,
        generation,
        move || {
            let as_model_error = |e: anyhow::Error| model::ModelError::InvalidParameter {
                name: "model",
                detail: format!("{e:#}"),
            };
            let model = load::load_model(&client, &model_args, &files).map_err(as_model_error)?;
            check_slot_memory(&client, &model, max_batch).map_err(as_model_error)?;
            let session = BatchSession::new(model, max_batch, !model_args.no_cuda_graph)?;
            warm_up(session)
        },
    )?;

    eprintln!(
        "serving {model_id} on http://{local} (POST /v1/chat/completions, /v1/completions; GET \
         /v1/models, /health, /metrics); Ctrl-C drains the requests in flight and stops"
    );
    let shutdown = async {
        while !interrupt::requested() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("stopping: finishing the requests in flight (Ctrl-C again to quit at once)");
    };
    tokio.block_on(server::serve(listener, engine, shutdown))?;
    // The server has drained: a clean exit, not an interrupted one.
    interrupt::clear();
    eprintln!("stopped");
    Ok(())
}

/// Refuses a `--max-batch` whose KV caches (one per slot, plus a spare for padding rows and one
/// to prefill in) do not fit the free device memory, before they are allocated.
fn check_slot_memory<R: Runtime>(
    client: &ComputeClient<R>,
    model: &model::Model<R>,
    max_batch: usize,
) -> anyhow::Result<()> {
    let bytes = SlotCache::<R>::bytes_for(
        model.config(),
        max_batch + 2,
        model.max_len(),
        model.dtype(),
    );
    if let Some(free) = runtime::free_memory(client) {
        if bytes as u64 > free {
            anyhow::bail!(
                "the KV caches of --max-batch {max_batch} at context {} need {} MB, the device \
                 has {} MB free: lower --max-batch or --max-len",
                model.max_len(),
                bytes / 1_000_000,
                free / 1_000_000
            );
        }
    }
    Ok(())
}

/// Compiles the kernels and captures the batched decode graphs before the first request, so
/// that its time to first token is the warm one: prompts of a few tokens and of a few dozen
/// (GEMV-shaped and tiled projections), the argmax and the logits read back, and every row
/// count of the batched step twice (the first run compiles, the second captures the graph).
fn warm_up<R: Runtime>(mut session: BatchSession<R>) -> model::Result<BatchSession<R>> {
    let start = Instant::now();
    let max_len = session.max_len();
    let slots = session.max_batch();
    let mut logits = Vec::new();
    for (slot, len) in [(0, 4usize), (0, 64)] {
        let len = len.min(max_len.saturating_sub(4)).max(1);
        session.prefill(slot, &vec![0; len])?;
        session.prefill_argmax()?;
        session.prefill_logits(&mut logits)?;
    }
    for slot in 1..slots {
        session.prefill(slot, &[0])?;
    }
    let mut rows = 1;
    loop {
        for _ in 0..2 {
            let batch: Vec<(usize, u32)> = (0..rows).map(|s| (s, 0)).collect();
            for &(slot, _) in &batch {
                if session.slot_len(slot) + 1 >= max_len {
                    session.prefill(slot, &[0])?;
                }
            }
            session.decode(&batch)?;
            session.decode_argmax()?;
            session.decode_logits(&mut logits)?;
        }
        if rows == slots {
            break;
        }
        rows = (rows * 2).min(slots);
    }
    for slot in 0..slots {
        session.release(slot);
    }
    eprintln!(
        "warm-up (kernel compilation, {} batch sizes) in {:.2} s",
        session_buckets(slots),
        start.elapsed().as_secs_f64()
    );
    Ok(session)
}

/// Row counts the batched step is compiled for: powers of two below `slots`, and `slots`.
fn session_buckets(slots: usize) -> usize {
    (0..).take_while(|&i| (1usize << i) < slots).count() + 1
}
