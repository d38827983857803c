//! The model and sampling flags shared by `generate`, `chat` and `serve`, loading a model with
//! a progress bar, and streaming a generation to stdout.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use cubecl::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};
use model::{
    demo, hub, CausalLm, GenerateOptions, GenerateOutput, GenerationConfig, Generator, LoadOptions,
    Model, ModelConfig, Prompt, SamplingParams, Session, SessionOptions, Tokenizer,
};
use ops::DType;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: a local directory or a Hugging Face repo id (looked up in the HF cache, downloaded
    /// if missing and the network allows). Default: DeepSeek-R1-Distill-Qwen-1.5B from the HF
    /// cache if present, else the built-in demo model.
    #[arg(long)]
    pub model: Option<String>,
    /// Compute dtype. Default: the checkpoint's where the runtime supports it, else f16.
    #[arg(long, value_parser = ["bf16", "f16", "f32"])]
    pub dtype: Option<String>,
    /// Context length (KV cache positions). Default: min(max_position_embeddings, 4096).
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Run every decode step eagerly instead of replaying it as a captured CUDA graph.
    #[arg(long)]
    pub no_cuda_graph: bool,
    #[command(flatten)]
    pub weights: crate::weight_args::WeightArgs,
}

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 means greedy. Default: the model's generation_config.json, else 0.
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens; 0 disables. Default: generation_config.json, else 0.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p, in (0, 1]; 1 disables.
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Repetition penalty (> 0; 1 disables). Also `--repetition-penalty`, transformers' name.
    #[arg(
        long,
        visible_alias = "repetition-penalty",
        allow_negative_numbers = true
    )]
    pub repeat_penalty: Option<f32>,
    /// Seed of the sampler: the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SamplingArgs {
    /// The flags, else the model's generation_config.json, else greedy; validated.
    pub fn params(&self, gc: &GenerationConfig) -> anyhow::Result<SamplingParams> {
        let params = model::sampling::resolve(
            &model::sampling::SamplingOverrides {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                repetition_penalty: self.repeat_penalty,
            },
            gc,
            self.seed,
        );
        params.validate()?;
        Ok(params)
    }
}

/// One line describing the sampling.
pub fn describe_sampling(params: &SamplingParams) -> String {
    if params.temperature == 0.0 {
        "greedy".to_string()
    } else {
        format!(
            "temperature {}, top-k {}, top-p {}, repeat-penalty {}, seed {}",
            params.temperature, params.top_k, params.top_p, params.repetition_penalty, params.seed
        )
    }
}

/// The model directory to load, with a notice for the user when a default was taken.
pub fn locate_model(spec: Option<&str>) -> anyhow::Result<PathBuf> {
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

/// The host-side files of a model: read (and checked) before anything is uploaded.
pub struct ModelFiles {
    pub dir: PathBuf,
    pub generation: GenerationConfig,
    pub tokenizer: Tokenizer,
}

impl ModelFiles {
    pub fn read(args: &ModelArgs) -> anyhow::Result<Self> {
        let dir = locate_model(args.model.as_deref())?;
        let config = ModelConfig::from_dir(&dir)?;
        let generation = GenerationConfig::from_dir(&dir)?;
        let tokenizer = Tokenizer::from_dir(&dir, &config, &generation)?;
        Ok(Self {
            dir,
            generation,
            tokenizer,
        })
    }
}

/// Uploads the model of `files` with a progress bar on stderr, prints what was loaded, and
/// returns it as a session ready to generate.
pub fn load_session<R: Runtime>(
    client: &ComputeClient<R>,
    args: &ModelArgs,
    files: &ModelFiles,
) -> anyhow::Result<Session<R>> {
    let model = load_model(client, args, files)?;
    Ok(Session::with_options(
        model,
        SessionOptions {
            cuda_graphs: !args.no_cuda_graph,
            ..SessionOptions::default()
        },
    )?)
}

/// Loads the model with a progress bar and prints what was loaded.
pub fn load_model<R: Runtime>(
    client: &ComputeClient<R>,
    args: &ModelArgs,
    files: &ModelFiles,
) -> anyhow::Result<Model<R>> {
    let dtype = args
        .dtype
        .as_deref()
        .map(|d| DType::parse(d).context("unknown dtype"))
        .transpose()?;
    let bar = ProgressBar::hidden();
    let mut started = false;
    let compression = args.weights.compression()?;
    let options = LoadOptions {
        dtype,
        max_len: args.max_len,
        compression,
        screen_lm_head: args.weights.screen_lm_head,
        device_free_bytes: runtime::free_memory(client),
    };
    let loaded = Model::<R>::load(client, &files.dir, &options, &mut |p| {
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
    if let Some(line) =
        crate::weight_args::memory_line(&report, compression, options.screen_lm_head)
    {
        eprintln!("{line}");
    }
    eprintln!(
        "loaded {} ({} layers), {} MB in {} (checkpoint {}), context {}, in {:.2} s",
        model.config().architecture,
        model.config().num_hidden_layers,
        report.bytes / 1_000_000,
        report.dtype,
        report.checkpoint_dtype,
        report.max_len,
        report.elapsed.as_secs_f64(),
    );
    Ok(model)
}

/// Generates, writing each piece of text to stdout as soon as it is complete, and ends the text
/// with a newline. Ctrl-C stops the generation at the next token (the stats then say
/// `cancelled`), and so does a closed stdout (e.g. piped into `head`).
pub fn generate_to_stdout<M: CausalLm>(
    generator: &mut Generator<M>,
    prompt: &Prompt,
    options: &GenerateOptions,
) -> model::Result<GenerateOutput> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut ends_with_newline = true;
    let result = generator.generate(prompt, options, |piece| {
        if crate::interrupt::requested() {
            return ControlFlow::Break(());
        }
        ends_with_newline = piece.ends_with('\n');
        if out
            .write_all(piece.as_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    if !ends_with_newline {
        let _ = writeln!(out);
    }
    let _ = out.flush();
    result
}
