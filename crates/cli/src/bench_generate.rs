//! `cubellm bench-generate`: prefill and decode speed of a model, after a warm-up that compiles the
//! kernels, and (when the model directory carries a transformers `reference.json`) agreement of
//! the first greedy tokens with it. One JSON line on stdout, a readable summary on stderr; with
//! `--record FILE` the same line, with the device, date, commit and the peer's numbers of the
//! same call (`--peer`), is appended to FILE (e.g. `benchmarks/e2e.jsonl`).
//!
//! With sampling flags (`--temperature`, `--top-k`, `--top-p`, `--repeat-penalty`) the same runs
//! are repeated sampled, and the line gains a `sampled` object: the parameters, where the
//! tokens were drawn (on the device, or on the host with `--host-sampling`, which copies the
//! logits back every token as generation did before the device sampler), the sampled decode
//! tok/s and its ratio to greedy's.

use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use cubecl::prelude::*;
use model::{
    self, GenerateOptions, Generator, LoadOptions, Model, Prompt, Session, SessionOptions,
    Tokenizer,
};
use ops::DType;

#[derive(Args, Debug)]
pub struct BenchGenerateArgs {
    /// Model directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt length in tokens (a synthetic prompt).
    #[arg(long, default_value_t = 512)]
    pub prompt_len: usize,
    /// Tokens to generate per run (greedy, end-of-sequence ignored).
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Timed runs (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// KV cache positions (default: prompt + new tokens + 64). The decode step plans its
    /// attention for the smallest of the cache rows 1 024, 4 096, 16 384, … up to this size that
    /// holds the context (one captured graph per rung): on sm_90+ up to 1 024 positions merge
    /// their key splits inside one thread-block cluster, more launch a merge kernel. Pass
    /// `generate`'s context (its `--max-len`, default 4096) to time what it runs.
    #[arg(long)]
    pub max_len: Option<usize>,
    /// Compute dtype (default: the checkpoint's where supported).
    #[arg(long, value_parser = ["bf16", "f16", "f32"])]
    pub dtype: Option<String>,
    /// Run every decode step eagerly instead of replaying it as a captured CUDA graph.
    #[arg(long)]
    pub no_cuda_graph: bool,
    #[command(flatten)]
    pub weights: crate::weight_args::WeightArgs,
    /// Append the result, with device, date and commit, to this JSON-lines file.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// A file holding the JSON line of a peer run in the same call (e.g. the output of
    /// `scripts/bench_torch_decode.py`), recorded beside ours.
    #[arg(long)]
    pub peer: Option<PathBuf>,
    /// The device's name for the record (default: what `nvidia-smi` reports, else the runtime).
    #[arg(long)]
    pub device_name: Option<String>,
    /// Batched decode instead: for each of these sequence counts (e.g. `1,4,16`; at most 16),
    /// that many sequences of the prompt decoded together, as `serve` batches requests; one
    /// line per count with the aggregate decode tok/s and the time of one step.
    #[arg(long, value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Also time sampled decoding with these parameters (top-k or top-p alone sample at
    /// temperature 1; the model's generation_config.json is not consulted).
    #[command(flatten)]
    pub sampling: crate::load::SamplingArgs,
    /// Sample on the host (the logits copied back every token) instead of on the device.
    #[arg(long)]
    pub host_sampling: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn bench_generate<R: Runtime>(
    client: &ComputeClient<R>,
    args: &BenchGenerateArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.prompt_len > 0 && args.new_tokens > 1 && args.runs > 0,
        "prompt-len, new-tokens (> 1) and runs must be positive"
    );
    let dtype = args
        .dtype
        .as_deref()
        .map(|d| DType::parse(d).context("unknown dtype"))
        .transpose()?;
    let dir = &args.model;
    let config = model::ModelConfig::from_dir(dir)?;
    let gc = model::GenerationConfig::from_dir(dir)?;
    let tokenizer = Tokenizer::from_dir(dir, &config, &gc)?;
    let max_len = args
        .max_len
        .unwrap_or(args.prompt_len + args.new_tokens + 64);
    anyhow::ensure!(
        max_len >= args.prompt_len + args.new_tokens,
        "--max-len {max_len} is shorter than the prompt and the new tokens ({})",
        args.prompt_len + args.new_tokens
    );
    let compression = args.weights.compression()?;
    let options = LoadOptions {
        dtype,
        max_len: Some(max_len),
        compression,
        screen_lm_head: args.weights.screen_lm_head,
        device_free_bytes: runtime::free_memory(client),
    };
    let (m, report) = Model::<R>::load(client, dir, &options, &mut |_| {})?;
    eprintln!(
        "loaded {} MB in {} in {:.1} s",
        report.bytes / 1_000_000,
        report.dtype,
        report.elapsed.as_secs_f64()
    );
    if let Some(line) =
        crate::weight_args::memory_line(&report, compression, options.screen_lm_head)
    {
        eprintln!("{line}");
    }
    // Explicit flags only: the checkpoint's sampling defaults do not turn sampling on here.
    let sampling = args.sampling.params(&model::GenerationConfig::default())?;
    let sampled = !sampling.is_plain_greedy();
    if !args.batch.is_empty() {
        anyhow::ensure!(!sampled, "--batch times greedy decoding only");
        return bench_batch(client, m, &report, args);
    }
    let session = Session::with_options(
        m,
        SessionOptions {
            cuda_graphs: !args.no_cuda_graph,
            device_sampling: !args.host_sampling,
        },
    )?;
    let mut g = Generator::new(session, tokenizer);

    // Ids the tokenizer can show, spread over its vocabulary.
    let shown = g.tokenizer().vocab_size().min(config.vocab_size).max(2) as u32;
    let prompt: Vec<u32> = (0..args.prompt_len as u32)
        .map(|i| (i * 7 + 3) % shown)
        .collect();
    let run_with = |g: &mut Generator<Session<R>>,
                    prompt: &[u32],
                    n: usize,
                    sampling: model::SamplingParams| {
        let opts = GenerateOptions {
            max_new_tokens: n,
            sampling,
            eos_token_ids: Some(Vec::new()),
            ..GenerateOptions::default()
        };
        g.generate(&Prompt::Tokens(prompt.to_vec()), &opts, |_| {
            ControlFlow::Continue(())
        })
    };
    let greedy = model::SamplingParams::greedy();
    let run =
        |g: &mut Generator<Session<R>>, prompt: &[u32], n: usize| run_with(g, prompt, n, greedy);
    // Timed runs after a warm-up that compiles every kernel (and captures the graphs): the
    // medians of prefill and decode tok/s.
    // The host's time per decode step, medians over the runs: launching the step, choosing the
    // token (waiting for the step, reading back), and the rest (detokenizer, stop checks).
    type Timed = (f64, f64, [f64; 3]);
    let timed = |g: &mut Generator<Session<R>>, params| -> anyhow::Result<Timed> {
        // Two warm-ups: a generation's first step runs on the host's token and greedy decoding
        // runs the later ones on the device's choice, each its own graph, captured at its
        // second run (the first step's in the second generation).
        run_with(g, &prompt, 8, params)?;
        run_with(g, &prompt, 8, params)?;
        let (mut prefill, mut decode) = (Vec::new(), Vec::new());
        let mut host = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..args.runs {
            let out = run_with(g, &prompt, args.new_tokens, params)?;
            let s = &out.stats;
            prefill.push(s.prefill_tokens_per_sec());
            decode.push(s.decode_tokens_per_sec());
            let per_step = 1e6 / s.generated_tokens.saturating_sub(1).max(1) as f64;
            let other = s
                .decode_time
                .saturating_sub(s.decode_launch_time + s.decode_choose_time);
            for (v, d) in host
                .iter_mut()
                .zip([s.decode_launch_time, s.decode_choose_time, other])
            {
                v.push(d.as_secs_f64() * per_step);
            }
        }
        Ok((median(prefill), median(decode), host.map(median)))
    };
    let screen_before = g.model().screen_stats()?;
    let (prefill, decode, [launch_us, choose_us, other_us]) = timed(&mut g, greedy)?;
    eprintln!(
        "host time per decode step: launch {launch_us:.1} us, choose (wait + read back) {choose_us:.1} us, other {other_us:.1} us"
    );
    // The screen's survivors per screened step over the greedy runs (warm-ups included).
    let screen_rows = match (screen_before, g.model().screen_stats()?) {
        (Some((s0, r0)), Some((s1, r1))) if s1 > s0 => {
            let per_step = r1.wrapping_sub(r0) as f64 / (s1 - s0) as f64;
            eprintln!(
                "screened LM head: {per_step:.1} rows computed again from the float head a step ({} steps)",
                s1 - s0
            );
            Some((per_step * 10.0).round() / 10.0)
        }
        _ => None,
    };
    let sampled_decode = if sampled {
        Some(timed(&mut g, sampling)?.1)
    } else {
        None
    };

    // Agreement with transformers' greedy continuation, when the directory has one.
    let mut agreement = String::from("null");
    if let Ok(text) = std::fs::read_to_string(dir.join("reference.json")) {
        let r: serde_json::Value = serde_json::from_str(&text).context("reference.json")?;
        let ids = |k: &str| -> Vec<u32> {
            r[k].as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_u64())
                        .map(|v| v as u32)
                        .collect()
                })
                .unwrap_or_default()
        };
        let (p, want) = (ids("prompt_ids"), ids("greedy_ids"));
        if !p.is_empty() && !want.is_empty() {
            let out = run(&mut g, &p, want.len())?;
            let same = out
                .tokens
                .iter()
                .zip(&want)
                .take_while(|(a, b)| a == b)
                .count();
            eprintln!(
                "greedy agreement with transformers: first {same} of {} tokens identical",
                want.len()
            );
            agreement = format!("{{\"same_prefix\":{same},\"of\":{}}}", want.len());
        }
    }
    let graph = g.model().uses_graph();
    eprintln!(
        "prompt {} tokens: prefill {prefill:.0} tok/s; decode {decode:.1} tok/s ({} new tokens, median of {} runs, {}{})",
        args.prompt_len,
        args.new_tokens,
        args.runs,
        R::name(client),
        if graph { ", decode step replayed as a CUDA graph" } else { "" }
    );
    let sampled = sampled_decode.map(|tok_s| {
        let place = if args.host_sampling { "host" } else { "device" };
        eprintln!(
            "sampled decode (temperature {}, top-k {}, top-p {}, repeat-penalty {}, on the {place}): {tok_s:.1} tok/s, {:.3} of greedy",
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            sampling.repetition_penalty,
            tok_s / decode
        );
        // f32 flags as written (0.7, not 0.699999988).
        let flag = |x: f32| x.to_string().parse::<f64>().unwrap_or(f64::NAN);
        serde_json::json!({
            "temperature": flag(sampling.temperature),
            "top_k": sampling.top_k,
            "top_p": flag(sampling.top_p),
            "repetition_penalty": flag(sampling.repetition_penalty),
            "on": place,
            "decode_tok_s": (tok_s * 100.0).round() / 100.0,
            "vs_greedy": (tok_s / decode * 1000.0).round() / 1000.0,
        })
    });
    let agreement: serde_json::Value = serde_json::from_str(&agreement)?;
    let line = serde_json::json!({
        "impl": "cubellm",
        "runtime": R::name(client),
        "dtype": report.dtype.to_string(),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "context": args.prompt_len + args.new_tokens,
        "max_len": report.max_len,
        "prefill_tok_s": (prefill * 10.0).round() / 10.0,
        "decode_tok_s": (decode * 100.0).round() / 100.0,
        "cuda_graph": graph,
        "host_us_per_step": {
            "launch": (launch_us * 10.0).round() / 10.0,
            "choose": (choose_us * 10.0).round() / 10.0,
            "other": (other_us * 10.0).round() / 10.0,
        },
        "weights": format!("{compression:?}"),
        "screen_lm_head": args.weights.screen_lm_head,
        "screen_rows_per_step": screen_rows,
        "weight_bytes": report.weight_bytes,
        "greedy_agreement": agreement,
        "sampled": sampled,
    });
    println!("{line}");
    if let Some(path) = &args.record {
        record(path, line, args, R::name(client))?;
    }
    Ok(())
}

/// `--batch`: aggregate decode speed of `n` sequences decoded together, for each `n`. Each step
/// reads its tokens back (as the server does, to hand them to the requests), so a step's time
/// includes that round trip.
fn bench_batch<R: Runtime>(
    client: &ComputeClient<R>,
    m: Model<R>,
    report: &model::LoadReport,
    args: &BenchGenerateArgs,
) -> anyhow::Result<()> {
    use model::{BatchLm, BatchSession};
    let most = args.batch.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(
        args.batch
            .iter()
            .all(|&n| (1..=model::BatchBuffers::<R>::MAX_ROWS).contains(&n)),
        "--batch counts must be 1 to {}",
        model::BatchBuffers::<R>::MAX_ROWS
    );
    let vocab = m.config().vocab_size as u32;
    let mut b = BatchSession::new(m, most, !args.no_cuda_graph)?;
    let prompt: Vec<u32> = (0..args.prompt_len as u32)
        .map(|i| (i * 7 + 3) % vocab)
        .collect();
    for &n in &args.batch {
        let mut times = Vec::new();
        for run in 0..=args.runs {
            for slot in 0..n {
                b.prefill(slot, &prompt)?;
            }
            let mut rows: Vec<(usize, u32)> = (0..n)
                .map(|s| (s, b.prefill_argmax().unwrap_or(0)))
                .collect();
            // The first run compiles and captures (warm-up); the others are timed.
            let steps = if run == 0 { 3 } else { args.new_tokens - 1 };
            let start = std::time::Instant::now();
            for _ in 0..steps {
                b.decode(&rows)?;
                let ids = b.decode_argmax()?;
                for (row, id) in rows.iter_mut().zip(ids) {
                    row.1 = id;
                }
            }
            if run > 0 {
                times.push(start.elapsed().as_secs_f64() / steps as f64);
            }
        }
        let step = median(times);
        let tok_s = n as f64 / step;
        eprintln!(
            "batch {n}: decode {tok_s:.1} tok/s aggregate ({:.1} per sequence), {:.3} ms per step{}",
            tok_s / n as f64,
            step * 1e3,
            if b.uses_graph(n) { ", replayed as a CUDA graph" } else { "" }
        );
        let line = serde_json::json!({
            "impl": "cubellm",
            "runtime": R::name(client),
            "dtype": report.dtype.to_string(),
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "max_len": report.max_len,
            "batch": n,
            "decode_tok_s": (tok_s * 100.0).round() / 100.0,
            "step_ms": (step * 1e6).round() / 1e3,
            "cuda_graph": b.uses_graph(n),
            "weight_bytes": report.weight_bytes,
        });
        println!("{line}");
        if let Some(path) = &args.record {
            record(path, line, args, R::name(client))?;
        }
        for slot in 0..n {
            b.release(slot);
        }
    }
    Ok(())
}

/// Appends `line` with the device, date, commit and peer to the JSON-lines file `path`.
fn record(
    path: &std::path::Path,
    mut line: serde_json::Value,
    args: &BenchGenerateArgs,
    runtime: &str,
) -> anyhow::Result<()> {
    use std::io::Write;
    let peer = match &args.peer {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading the peer's result {}", p.display()))?;
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            serde_json::from_str::<serde_json::Value>(last)
                .with_context(|| format!("{}: the last line is not JSON", p.display()))?
        }
        None => serde_json::Value::Null,
    };
    let device = args
        .device_name
        .clone()
        .or_else(nvidia_smi_name)
        .unwrap_or_else(|| runtime.to_string());
    let fields = line.as_object_mut().expect("the result is an object");
    fields.insert("device".into(), device.into());
    fields.insert("date".into(), utc_date().into());
    let commit = option_env!("CUBELLM_BUILD_COMMIT").unwrap_or("unknown");
    fields.insert("commit".into(), commit.into());
    fields.insert("peer".into(), peer);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(file, "{line}")?;
    eprintln!("recorded in {}", path.display());
    Ok(())
}

/// The first GPU's name as `nvidia-smi` reports it.
fn nvidia_smi_name() -> Option<String> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let name = text.lines().next()?.trim();
    (out.status.success() && !name.is_empty()).then(|| name.to_string())
}

/// Today's date in UTC, `YYYY-MM-DD` (civil-from-days, proleptic Gregorian).
fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
