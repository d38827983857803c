//! `cubellm`: run the library from the command line.
//!
//! ```text
//! cubellm --runtime cuda|wgpu|auto selfcheck      # every kernel vs its CPU reference, as a table
//! cubellm --runtime cuda bench [--family norm]    # device timings as JSON lines
//! cubellm bench --family matmul --gemm-tile 128,128,2,4,3   # a tensor-core tile sweep point
//! cubellm bench --family attention --attention-tile 'decode=8,128,1'   # an attention tile
//! cubellm generate --prompt "Hello" [--model DIR|org/name] [--temperature 0.7 ...]
//! cubellm chat [--model ...] [--system "..."]        # interactive, streamed
//! cubellm serve [--model ...] [--port 8080]           # OpenAI-compatible HTTP server
//! cubellm make-demo-model --out DIR                # the built-in demo model, as files
//! ```

use std::process::ExitCode;

mod bench_generate;
mod chat;
mod generate;
mod interrupt;
mod load;
mod selfcheck;
mod serve;
mod weight_args;

use clap::{Parser, Subcommand};
use cubecl::prelude::*;
use ops::matmul::CmmaTile;
use runtime::kernel_cache::KernelCache;
use runtime::RuntimeChoice;

#[derive(Parser, Debug)]
#[command(
    name = "cubellm",
    version,
    about = "Portable LLM-inference kernels (CubeCL): generate, chat, serve, check, bench"
)]
struct Cli {
    /// Runtime: cuda, wgpu, or auto (CUDA if a device is present, else wgpu).
    #[arg(long, global = true, default_value = "auto")]
    runtime: RuntimeChoice,
    /// Directory of the persistent kernel cache (compiled kernels kept between runs; CUDA only).
    /// Default: $XDG_CACHE_HOME/cubellm/kernels, else ~/.cache/cubellm/kernels.
    #[arg(long, global = true, value_name = "DIR")]
    kernel_cache: Option<std::path::PathBuf>,
    /// Compile every kernel afresh instead of using the persistent kernel cache.
    #[arg(long, global = true, conflicts_with = "kernel_cache")]
    no_kernel_cache: bool,
    /// Launch kernels without programmatic dependent launch (CUDA on Hopper and newer, where it
    /// is on by default): for measuring what it gains.
    #[arg(long, global = true)]
    no_pdl: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every kernel once per dtype against its CPU f64 reference and print a table.
    Selfcheck,
    /// Time the kernels on the device and print one JSON line per case.
    Bench {
        /// Only this family (default: all).
        #[arg(long)]
        family: Option<String>,
        /// Only cases whose name contains this text.
        #[arg(long, default_value = "")]
        filter: String,
        /// Force this tensor-core tile, `bm,bn,warps_m,warps_n,stages[,bk]` (e.g.
        /// 128,128,2,4,3; stages 0 = register staging, bk 32 or 64), on the matmul cases that
        /// run on tensor cores (those it cannot run keep their default tile).
        #[arg(long, value_parser = parse_gemm_tile)]
        gemm_tile: Option<CmmaTile>,
        /// Force tensor-core attention tiles on the attention cases,
        /// `prefill=WARPS,BK;decode=WARPS,BK,CUBES_PER_SM` (either part may be left out; the
        /// cases' names then carry the tiles).
        #[arg(long, value_parser = bench::attention::AttentionTuning::parse)]
        attention_tile: Option<bench::attention::AttentionTuning>,
    },
    /// Generate text with a Qwen2, Qwen3 or Llama model, streaming it to stdout (stats go to stderr).
    Generate(generate::GenerateArgs),
    /// Chat with the model interactively (history, chat template, streamed answers).
    Chat(chat::ChatArgs),
    /// Serve the model over HTTP with the OpenAI API (chat and text completions, streaming).
    Serve(serve::ServeArgs),
    /// Measure prefill and decode speed of a model (and greedy agreement with a reference).
    BenchGenerate(bench_generate::BenchGenerateArgs),
    /// Write the built-in demo model (tiny Qwen2, random weights, trained tokenizer) to a directory.
    MakeDemoModel(generate::MakeDemoArgs),
}

fn selfcheck<R: Runtime>(client: &ComputeClient<R>) -> anyhow::Result<bool> {
    let rows = crate::selfcheck::run(client)?;
    println!(
        "{:<22} {:<6} {:<12} {:>12} {:>10}  result",
        "op", "dtype", "shape", "rel. error", "tolerance"
    );
    for r in &rows {
        println!(
            "{:<22} {:<6} {:<12} {:>12.3e} {:>10.0e}  {}",
            r.op,
            r.dtype.name(),
            r.shape,
            r.error,
            r.tolerance,
            if r.passed() { "ok" } else { "FAILED" }
        );
    }
    let failed = rows.iter().filter(|r| !r.passed()).count();
    println!("{} passed, {} failed", rows.len() - failed, failed);
    Ok(failed == 0)
}

/// `--gemm-tile`: a tile [`CmmaTile::parse`] accepts.
fn parse_gemm_tile(text: &str) -> Result<CmmaTile, String> {
    CmmaTile::parse(text).ok_or_else(|| {
        format!(
            "'{text}' is not a tensor-core tile: expected bm,bn,warps_m,warps_n,stages[,bk] \
             (e.g. 128,128,2,4,3) with planes of whole 16x16 fragments, stages 0 or 2-8, bk 32 \
             or 64"
        )
    })
}

fn bench<R: Runtime>(
    client: &ComputeClient<R>,
    family: Option<&str>,
    filter: &str,
    gemm_tile: Option<CmmaTile>,
    attention_tile: Option<bench::attention::AttentionTuning>,
) -> anyhow::Result<()> {
    let families: Vec<&'static str> = match family {
        Some(f) => match bench::FAMILIES
            .iter()
            .chain(bench::SWEEPS)
            .find(|k| **k == f)
        {
            Some(k) => vec![*k],
            None => anyhow::bail!(
                "unknown bench family '{f}' (known: {})",
                bench::FAMILIES
                    .iter()
                    .chain(bench::SWEEPS)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        None => bench::FAMILIES.to_vec(),
    };
    for f in families {
        let cases = match (f, gemm_tile, attention_tile) {
            ("matmul", Some(tile), _) => bench::matmul::cases_with(client, Some(tile)),
            ("attention", _, Some(tuning)) => bench::attention::cases_tuned(client, &tuning),
            _ => bench::cases(client, f),
        };
        bench::measure(client, f, cases, filter);
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<bool> {
    if let Command::MakeDemoModel(args) = &cli.command {
        generate::make_demo_model(args)?;
        return Ok(true);
    }
    let cache = if cli.no_kernel_cache {
        KernelCache::Off
    } else {
        cli.kernel_cache
            .clone()
            .map(KernelCache::Dir)
            .unwrap_or_else(KernelCache::default_location)
    };
    runtime::kernel_cache::configure(&cache);
    if cli.no_pdl {
        runtime::set_programmatic_launch(false);
        ops::caps::set_programmatic_launch(false);
    }
    let backend = runtime::resolve(cli.runtime)?;
    eprintln!("runtime: {backend}");
    runtime::with_runtime!(backend, |client: R| {
        let outcome = run_command::<R>(&client, &cli.command);
        // The command's device buffers and graphs are freed by the runtime's device thread; let
        // it finish before the process exits, where the CUDA driver shuts down under a thread
        // still at work (it panicked with CUDA_ERROR_DEINITIALIZED after `bench-generate`).
        let _ = cubecl::future::block_on(client.sync());
        outcome
    })
}

/// Runs a device command; its device resources are dropped when it returns.
fn run_command<R: Runtime>(client: &ComputeClient<R>, command: &Command) -> anyhow::Result<bool> {
    match command {
        Command::Selfcheck => selfcheck::<R>(client),
        Command::Bench {
            family,
            filter,
            gemm_tile,
            attention_tile,
        } => bench::<R>(
            client,
            family.as_deref(),
            filter,
            *gemm_tile,
            *attention_tile,
        )
        .map(|_| true),
        Command::Generate(args) => generate::generate::<R>(client, args).map(|_| true),
        Command::Chat(args) => chat::chat::<R>(client, args).map(|_| true),
        Command::Serve(args) => serve::serve::<R>(client, args).map(|_| true),
        Command::BenchGenerate(args) => {
            bench_generate::bench_generate::<R>(client, args).map(|_| true)
        }
        Command::MakeDemoModel(_) => unreachable!("handled before the runtime is created"),
    }
}

/// Mesa's Vulkan and EGL drivers try a Wayland connection while wgpu looks for adapters, and
/// where `XDG_RUNTIME_DIR` is unset (headless servers, containers) libwayland prints
/// "error: XDG_RUNTIME_DIR is invalid or not set in the environment." once per driver: lines
/// that read like failures before every command's output, and break the one-line error of a
/// bad input. The connection fails either way; with the variable pointing at the temporary
/// directory it fails quietly.
fn quiet_wayland_probe() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // Before any thread exists: nothing else reads the environment concurrently.
        std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir());
    }
}

fn main() -> ExitCode {
    quiet_wayland_probe();
    interrupt::install();
    let cli = Cli::parse();
    let result = run(cli);
    if interrupt::requested() {
        // What was generated is already flushed; say why the run ended early.
        match &result {
            Err(e) => eprintln!("interrupted ({})", format!("{e:#}").replace('\n', " ")),
            Ok(_) => eprintln!("interrupted"),
        }
        return ExitCode::from(interrupt::EXIT_STATUS);
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            // One line: anyhow's chain joined with ": ", newlines of inner messages folded.
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
