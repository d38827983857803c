//! Runs to the end of the context: a prompt, then greedy decode steps until the KV cache is full,
//! and the last step's logits checked against a reference model that sees the same tokens in
//! one prefill (another code path: prefill attention instead of split-KV decode attention, and
//! for the reference an f32 model).
//!
//! The demo model runs to its full context (512 positions) on every runtime. The ignored
//! `large_model_runs_to_a_long_context` runs a larger model, `CUBELLM_LONG_CONTEXT_MODEL`
//! (`CUBELLM_LONG_CONTEXT_LEN`, default 32768; `CUBELLM_LONG_CONTEXT_DTYPE`, default the
//! checkpoint's): on the GPU machine, the 1.5B shape of `scripts/make_hf_fixtures.py --big` at
//! 32k positions.

use std::path::Path;

use cubecl::prelude::*;
use model::{CausalLm, LoadOptions, Session};
use ops::DType;
use testkit::on_each_runtime_one_cuda_at_a_time;

use crate::{load, logit_tolerance, worst_row_error, Demo};

/// Decode steps at the end of the context (the rest is prompt).
const DECODE_STEPS: usize = 64;
/// The short context whose error bounds a long one's in a half dtype.
const SHORT_CONTEXT: usize = 512;

struct Filled {
    tokens: Vec<u32>,
    logits: Vec<f32>,
    dtype: DType,
}

/// A fixed pseudo-random prompt of `n` ids below `vocab` (an LCG from `seed`), the same on every
/// runtime.
fn seeded_prompt(n: usize, vocab: u64, mut state: u64) -> Vec<u32> {
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab) as u32
        })
        .collect()
}

/// Prefills `max_len - DECODE_STEPS` seeded tokens, then decodes greedily to the end of the
/// context; returns every token fed and the logits after the last one.
fn fill<R: Runtime>(
    client: &ComputeClient<R>,
    dir: &Path,
    dtype: Option<DType>,
    max_len: usize,
) -> Filled {
    let options = LoadOptions {
        dtype,
        max_len: Some(max_len),
        device_free_bytes: testkit::runtime::free_memory(client),
        ..LoadOptions::default()
    };
    let (m, report) = load(client, dir, &options).unwrap();
    let vocab = m.config().vocab_size as u64;
    let mut session = Session::new(m).unwrap();
    let mut tokens = seeded_prompt(max_len - DECODE_STEPS, vocab, 0x2545_f491_4f6c_dd1d);
    session.prefill(&tokens).unwrap();
    while session.len() < max_len {
        let next = session.argmax().unwrap();
        tokens.push(next);
        session.decode(next).unwrap();
    }
    assert_eq!(session.len(), max_len);
    let mut logits = Vec::new();
    session.logits(&mut logits).unwrap();
    // One more position does not fit, and says so.
    let next = session.argmax().unwrap();
    assert_eq!(session.decode(next).unwrap_err().kind(), "context-overflow");
    let used = client.memory_usage().unwrap();
    eprintln!(
        "{} {} context {max_len}: device memory reserved {:.2} GB (weights {:.2} GB), driver \
         reports {} bytes free",
        dir.display(),
        report.dtype,
        used.bytes_reserved as f64 / 1e9,
        report.weight_bytes as f64 / 1e9,
        testkit::runtime::free_memory(client)
            .map(|b| b.to_string())
            .unwrap_or_else(|| "no figure of".into()),
    );
    Filled {
        tokens,
        logits,
        dtype: report.dtype,
    }
}

/// The relative error of the last logits of a full `max_len` context, run in `dtype`, against
/// an f32 model's prefill of the same tokens.
fn full_context_error<R: Runtime>(
    client: &ComputeClient<R>,
    dir: &Path,
    dtype: Option<DType>,
    max_len: usize,
) -> (f64, DType) {
    let filled = fill(client, dir, dtype, max_len);
    let (reference, _) = load(
        client,
        dir,
        &LoadOptions {
            dtype: Some(DType::F32),
            max_len: Some(max_len),
            device_free_bytes: testkit::runtime::free_memory(client),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let vocab = reference.config().vocab_size;
    let mut reference = Session::new(reference).unwrap();
    // Everything the decode path was fed, in one prefill: the logits of position max_len - 1.
    reference.prefill(&filled.tokens).unwrap();
    let mut want = Vec::new();
    reference.logits(&mut want).unwrap();
    assert_eq!(want.len(), vocab);
    let err = worst_row_error(&filled.logits, &want, vocab);
    let top = |l: &[f32]| {
        l.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .unwrap()
    };
    eprintln!(
        "context {max_len} in {}: last logits vs f32 prefill: relative error {err:.2e}, top-1 {} \
         vs {}",
        filled.dtype,
        top(&filled.logits),
        top(&want)
    );
    (err, filled.dtype)
}

/// In f32 the two paths agree to f32 rounding at any length. In a half dtype the error of the
/// end of the context may not exceed twice the error of a short context of the same model
/// (the rounding of the weights and activations, which transformers shares), or the dtype's
/// tolerance where that is larger.
fn check_full_context<R: Runtime>(
    client: &ComputeClient<R>,
    dir: &Path,
    dtype: Option<DType>,
    max_len: usize,
) {
    let (err, run_dtype) = full_context_error(client, dir, dtype, max_len);
    let bound = if run_dtype == DType::F32 {
        logit_tolerance(DType::F32)
    } else {
        let short = max_len.min(SHORT_CONTEXT);
        let (short_err, _) = full_context_error(client, dir, dtype, short);
        logit_tolerance(run_dtype).max(2.0 * short_err)
    };
    assert!(
        err <= bound,
        "last logits of a full {max_len}-position context in {run_dtype}: relative error \
         {err:.3e} > {bound:.3e}"
    );
}

fn demo_full_context<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    check_full_context(client, &demo.0, None, model::demo::MAX_POSITIONS);
}

#[test]
fn demo_model_runs_to_its_full_context() {
    on_each_runtime_one_cuda_at_a_time!(demo_full_context);
}

/// Decodes across the first two rungs of cache rows a session plans its decode attention for
/// (the first: the rows the clustered decode attention takes on sm_90, 1 024 elsewhere; the
/// second twice that) on a longer cache: the steps whose context fits a rung plan for a view of
/// the cache's first rows (on CUDA each rung its own graph; the first the clustered launch, the
/// second a key split over every SM and a merge kernel), the steps past the second for the whole
/// cache. Every step's logits, on both sides of each bound, match an f32 prefill of the same
/// tokens (bf16 where the runtime has it, else f32).
fn across_clustered_rows<R: Runtime>(client: &ComputeClient<R>) {
    let dtype = if ops::caps::supports_dtype(client, DType::BF16) {
        DType::BF16
    } else {
        DType::F32
    };
    let head_dim = model::demo::HIDDEN / model::demo::HEADS;
    let rows = ops::attention::clustered_decode_keys(client, dtype, head_dim).unwrap_or(1024);
    const AROUND: usize = 4;
    let max_len = 2 * rows + 64;
    let demo = Demo::new();
    let options = |dtype| LoadOptions {
        dtype: Some(dtype),
        max_len: Some(max_len),
        device_free_bytes: testkit::runtime::free_memory(client),
        ..LoadOptions::default()
    };
    let (m, _) = load(client, &demo.0, &options(dtype)).unwrap();
    let vocab = m.config().vocab_size;
    let mut session = Session::new(m).unwrap();
    let (reference, _) = load(client, &demo.0, &options(DType::F32)).unwrap();
    let mut reference = Session::new(reference).unwrap();
    for bound in [rows, 2 * rows] {
        let mut tokens = seeded_prompt(bound - AROUND, vocab as u64, 0x9e37_79b9_7f4a_7c15);
        session.reset().unwrap();
        session.prefill(&tokens).unwrap();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for _ in 0..2 * AROUND {
            let next = session.argmax().unwrap();
            tokens.push(next);
            session.decode(next).unwrap();
            session.logits(&mut got).unwrap();
            reference.reset().unwrap();
            reference.prefill(&tokens).unwrap();
            reference.logits(&mut want).unwrap();
            let err = worst_row_error(&got, &want, vocab);
            eprintln!(
                "context {} of {max_len} (bound {bound} rows): relative error {err:.2e}",
                tokens.len()
            );
            assert!(
                err <= logit_tolerance(dtype),
                "decode step at context {} (bound {bound} rows): relative error {err:.3e}",
                tokens.len()
            );
        }
        assert!(session.len() > bound, "the steps crossed the bound");
    }
    let cuda = ops::caps::runtime_name(client) == "cuda";
    assert_eq!(session.uses_graph(), cuda, "graphs on CUDA only");
}

#[test]
fn decode_steps_across_the_first_planned_rows_match_a_prefill() {
    on_each_runtime_one_cuda_at_a_time!(across_clustered_rows);
}

fn large_full_context<R: Runtime>(client: &ComputeClient<R>) {
    let dir = std::env::var("CUBELLM_LONG_CONTEXT_MODEL")
        .expect("CUBELLM_LONG_CONTEXT_MODEL names the model directory of this test");
    let len = std::env::var("CUBELLM_LONG_CONTEXT_LEN")
        .map(|v| v.parse().expect("CUBELLM_LONG_CONTEXT_LEN is a number"))
        .unwrap_or(32768);
    let dtype = std::env::var("CUBELLM_LONG_CONTEXT_DTYPE")
        .ok()
        .map(|d| DType::parse(&d).expect("CUBELLM_LONG_CONTEXT_DTYPE is a dtype"));
    check_full_context(client, Path::new(&dir), dtype, len);
}

/// Opt-in (it needs a large model directory): see the module docs.
#[test]
#[ignore = "needs CUBELLM_LONG_CONTEXT_MODEL (a large model directory)"]
fn large_model_runs_to_a_long_context() {
    on_each_runtime_one_cuda_at_a_time!(large_full_context);
}

fn beyond_device_memory<R: Runtime>(client: &ComputeClient<R>) {
    let dir = std::env::var("CUBELLM_LONG_CONTEXT_MODEL")
        .expect("CUBELLM_LONG_CONTEXT_MODEL names the model directory of this test");
    let free = testkit::runtime::free_memory(client).expect("the driver reports free memory");
    let (m, _) = load(client, Path::new(&dir), &LoadOptions::default()).unwrap();
    let per_position = model::KvCache::<R>::bytes_for(m.config(), 1, DType::F32) as u64;
    drop(m);
    // Twice the free memory in KV cache, with the check before allocation turned off (no free
    // memory given): the allocation itself fails, as a typed error.
    let max_len = (2 * free / per_position) as usize;
    let loaded = load(
        client,
        Path::new(&dir),
        &LoadOptions {
            dtype: Some(DType::F32),
            max_len: Some(max_len),
            ..LoadOptions::default()
        },
    )
    .and_then(|(m, _)| {
        let mut session = Session::new(m)?;
        session.prefill(&[1, 2, 3])?;
        session.argmax()
    });
    let err = loaded.expect_err("a cache of twice the free memory");
    eprintln!("context {max_len} without the check: {err}");
    // The check itself refuses it before allocating.
    let err = load(
        client,
        Path::new(&dir),
        &LoadOptions {
            dtype: Some(DType::F32),
            max_len: Some(max_len),
            device_free_bytes: Some(free),
            ..LoadOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), "device-memory", "{err}");
}

/// Opt-in, CUDA only: what a device out-of-memory looks like when the check is bypassed.
#[test]
#[ignore = "needs CUDA and CUBELLM_LONG_CONTEXT_MODEL (a large model directory)"]
fn large_model_beyond_device_memory_is_an_error() {
    on_each_runtime_one_cuda_at_a_time!(beyond_device_memory);
}
