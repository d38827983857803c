//! `cubellm serve`: the OpenAI-compatible HTTP server (the `server` crate) over a model loaded
//! like `generate` loads it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use cubecl::prelude::*;
use model::{GenerateOptions, Generator, Prompt, SamplingParams};
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
    /// Requests that may wait behind the one being generated; more are refused with HTTP 503.
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

    let tokenizer = files.tokenizer.clone();
    let generation = files.generation.clone();
    let (client, model_args) = (client.clone(), args.model.clone());
    let engine = Engine::start(
        EngineOptions {
            model_id: model_id.clone(),
            max_waiting: args.queue_size,
        },
        tokenizer,
        generation,
        move || {
            let session = load::load_session(&client, &model_args, &files).map_err(|e| {
                model::ModelError::InvalidParameter {
                    name: "model",
                    detail: format!("{e:#}"),
                }
            })?;
            warm_up(session, &files.tokenizer)
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

/// Compiles the kernels (and captures the decode graph) with short generations before the first
/// request, so that its time to first token is the warm one. Prompts of a few tokens and of a
/// few dozen take different kernels (GEMV-shaped and tiled projections), so both are run, and a
/// sampled request reads the logits back where a greedy one reads the argmax.
fn warm_up<M: model::CausalLm>(session: M, tokenizer: &model::Tokenizer) -> model::Result<M> {
    let start = Instant::now();
    let max_len = session.max_len();
    let mut generator = Generator::new(session, tokenizer.clone());
    let greedy = GenerateOptions {
        max_new_tokens: 3,
        sampling: SamplingParams::greedy(),
        stop_strings: Vec::new(),
        eos_token_ids: Some(Vec::new()),
    };
    let sampled = GenerateOptions {
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::greedy()
        },
        ..greedy.clone()
    };
    for (len, options) in [(4, &greedy), (64, &greedy), (4, &sampled)] {
        let len = len
            .min(max_len.saturating_sub(greedy.max_new_tokens))
            .max(1);
        let prompt = Prompt::Tokens(vec![0; len]);
        generator.generate(&prompt, options, |_| std::ops::ControlFlow::Continue(()))?;
    }
    eprintln!(
        "warm-up (kernel compilation) in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    Ok(generator.into_parts().0)
}
