//! `cubellm generate` and `cubellm make-demo-model`.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use cubecl::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};
use model::{
    self, demo, hub, ChatMessage, GenerateOptions, GenerationConfig, Generator, LoadOptions, Model,
    Prompt, SamplingParams, Session, SessionOptions, Tokenizer,
};
use ops::DType;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// Model: a local directory or a Hugging Face repo id (looked up in the HF cache, downloaded
    /// if missing and the network allows). Default: DeepSeek-R1-Distill-Qwen-1.5B from the HF
    /// cache if present, else the built-in demo model.
    #[arg(long)]
    pub model: Option<String>,
    /// The prompt.
    #[arg(long, short)]
    pub prompt: String,
    /// Render the prompt as a user message with the model's chat template (default when the
    /// model has one).
    #[arg(long, conflicts_with = "raw")]
    pub chat: bool,
    /// Feed the prompt to the model as it is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// A system message (chat mode only).
    #[arg(long)]
    pub system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 means greedy. Default: the model's generation_config.json, else 0.
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens; 0 disables. Default: generation_config.json, else 0.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p, in (0, 1]; 1 disables.
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Repetition penalty (> 0; 1 disables).
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// Seed of the sampler: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compute dtype. Default: the checkpoint's where the runtime supports it, else f16.
    #[arg(long, value_parser = ["bf16", "f16", "f32"])]
    pub dtype: Option<String>,
    /// Context length (KV cache positions). Default: min(max_position_embeddings, 4096).
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Stop when the text contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Run every decode step eagerly instead of replaying it as a captured CUDA graph.
    #[arg(long)]
    pub no_cuda_graph: bool,
    #[command(flatten)]
    pub weights: crate::weight_args::WeightArgs,
}

#[derive(Args, Debug)]
pub struct MakeDemoArgs {
    /// Directory to write the demo model into (created if needed).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn make_demo_model(args: &MakeDemoArgs) -> anyhow::Result<()> {
    demo::write_demo_model(&args.out)?;
    eprintln!(
        "wrote the demo model ({}) to {}",
        demo::DEMO_VERSION,
        args.out.display()
    );
    Ok(())
}

/// The model directory to load, with a notice for the user when a default was taken.
fn locate_model(spec: Option<&str>) -> anyhow::Result<PathBuf> {
    if let Some(spec) = spec {
        let source = hub::resolve_model(spec)?;
        if let hub::ModelSource::HfCache { repo, dir }
        | hub::ModelSource::Downloaded { repo, dir } = &source
        {
            eprintln!("model: {repo} ({})", dir.display());
        }
        return Ok(source.dir().to_path_buf());
    }
    if let Some(dir) = hub::find_complete_in_hf_cache(hub::DEFAULT_REPO) {
        eprintln!("model: {} ({})", hub::DEFAULT_REPO, dir.display());
        return Ok(dir);
    }
    let dir = demo::ensure_demo_model()?;
    eprintln!(
        "note: {} is not in the HF cache; using the built-in demo model (random weights: the text is gibberish) from {}",
        hub::DEFAULT_REPO,
        dir.display()
    );
    Ok(dir)
}

/// Sampling parameters: the flags, else the model's generation_config.json, else greedy.
fn sampling(args: &GenerateArgs, gc: &GenerationConfig) -> SamplingParams {
    let from_config = gc.do_sample == Some(true);
    let wants_sampling = from_config || args.top_k.is_some() || args.top_p.is_some();
    let temperature = args.temperature.unwrap_or(if wants_sampling {
        gc.temperature.map(|t| t as f32).unwrap_or(1.0)
    } else {
        0.0
    });
    SamplingParams {
        temperature,
        top_k: args
            .top_k
            .or(if from_config { gc.top_k } else { None })
            .unwrap_or(0),
        top_p: args
            .top_p
            .or(if from_config {
                gc.top_p.map(|p| p as f32)
            } else {
                None
            })
            .unwrap_or(1.0),
        repetition_penalty: args
            .repeat_penalty
            .or(gc.repetition_penalty.map(|p| p as f32))
            .unwrap_or(1.0),
        seed: args.seed,
    }
}

pub fn generate<R: Runtime>(client: &ComputeClient<R>, args: &GenerateArgs) -> anyhow::Result<()> {
    let dtype = args
        .dtype
        .as_deref()
        .map(|d| DType::parse(d).context("unknown dtype"))
        .transpose()?;
    let dir = locate_model(args.model.as_deref())?;

    // Host-side files first: a broken tokenizer or bad sampling flags fail before the upload.
    let config = model::ModelConfig::from_dir(&dir)?;
    let gc = GenerationConfig::from_dir(&dir)?;
    let tokenizer = Tokenizer::from_dir(&dir, &config, &gc)?;
    let params = sampling(args, &gc);
    params.validate()?;
    let chat = if args.raw {
        false
    } else if args.chat {
        if !tokenizer.has_chat_template() {
            bail!("--chat: this model has no chat template; use --raw");
        }
        true
    } else {
        tokenizer.has_chat_template()
    };
    if args.system.is_some() && !chat {
        bail!("--system needs chat mode (the model has a chat template and --raw is not given)");
    }
    let prompt = if chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(args.prompt.clone()));
        Prompt::Chat(messages)
    } else {
        Prompt::Text(args.prompt.clone())
    };

    let bar = ProgressBar::hidden();
    let mut started = false;
    let compression = args.weights.compression()?;
    let options = LoadOptions {
        dtype,
        max_len: args.max_len,
        compression,
        device_free_bytes: runtime::free_memory(client),
    };
    let loaded = Model::<R>::load(client, &dir, &options, &mut |p| {
        if !started {
            started = true;
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.set_length(p.bytes_total);
            bar.set_style(
                ProgressStyle::with_template(
                    "loading {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}) {msg}",
                )
                .expect("valid template"),
            );
        }
        bar.set_position(p.bytes_done);
        bar.set_message(format!("{}/{}", p.index, p.count));
        if crate::interrupt::requested() {
            // Nothing is written yet: stop between two uploads.
            bar.finish_and_clear();
            eprintln!("interrupted while loading");
            std::process::exit(crate::interrupt::EXIT_STATUS.into());
        }
    });
    bar.finish_and_clear();
    let (model, report) = loaded?;
    for n in &report.notices {
        eprintln!("{n}");
    }
    if let Some(line) = crate::weight_args::memory_line(&report, compression) {
        eprintln!("{line}");
    }
    eprintln!(
        "loaded {} ({} layers), {} MB in {} (checkpoint {}), context {}, in {:.2} s; sampling: {}",
        model.config().architecture,
        model.config().num_hidden_layers,
        report.bytes / 1_000_000,
        report.dtype,
        report.checkpoint_dtype,
        report.max_len,
        report.elapsed.as_secs_f64(),
        if params.temperature == 0.0 {
            "greedy".to_string()
        } else {
            format!(
                "temperature {}, top-k {}, top-p {}, repeat-penalty {}, seed {}",
                params.temperature,
                params.top_k,
                params.top_p,
                params.repetition_penalty,
                params.seed
            )
        }
    );

    let session = Session::with_options(
        model,
        SessionOptions {
            cuda_graphs: !args.no_cuda_graph,
        },
    )?;
    let mut generator = Generator::new(session, tokenizer);
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling: params,
        stop_strings: args.stop.clone(),
        eos_token_ids: None,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut ends_with_newline = true;
    let result = generator.generate(&prompt, &options, |piece| {
        if crate::interrupt::requested() {
            // Ctrl-C: keep what was written, end the line, report the stats.
            return ControlFlow::Break(());
        }
        ends_with_newline = piece.ends_with('\n');
        if out
            .write_all(piece.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            // stdout closed (e.g. piped into `head`): stop generating.
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    if !ends_with_newline {
        let _ = writeln!(out);
    }
    let output = result?;
    eprintln!("{}", output.stats.summary());
    Ok(())
}
