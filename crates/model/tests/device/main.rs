//! Model tests that need a device: loading real checkpoints onto every runtime present (wgpu on
//! lavapipe in CI, CUDA on the GPU machine), the dtype policy, KV cache and decode buffers,
//! sessions, the comparison with the transformers fixtures of every family, and compressed
//! weights.
//!
//! `CUBELLM_TEST_RUNTIMES=cuda` (or `wgpu`) restricts the runtimes, as for the kernel tests.

mod batch;
#[path = "../common/mod.rs"]
mod common;
mod compressed;
mod loading;
mod long_context;
mod sampling;
mod session;
mod transformers;

use std::path::PathBuf;

use cubecl::prelude::*;
use model::{LoadOptions, Model, ModelError, WeightStore};
use ops::DType;

/// A committed fixture, found from the working directory first (the test binary may run from the
/// repository root of a checkout at another path, e.g. on the GPU machine; `cargo test` runs it
/// from this crate's directory), else from this crate's source dir.
pub fn fixture(name: &str) -> PathBuf {
    for root in ["tests/fixtures/hf", "crates/model/tests/fixtures/hf"] {
        let dir = PathBuf::from(root).join(name);
        if dir.is_dir() {
            return dir;
        }
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

/// A model directory under the temporary directory, removed when dropped.
pub struct Demo(pub PathBuf);

impl Demo {
    /// A fresh empty directory.
    pub fn empty(tag: &str) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "cubellm-model-device-{tag}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Demo(dir)
    }

    /// The demo model.
    fn new() -> Self {
        let dir = Self::empty("demo");
        model::demo::ensure_demo_model_in(&dir.0).unwrap();
        dir
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn load<R: Runtime>(
    client: &ComputeClient<R>,
    dir: &std::path::Path,
    options: &LoadOptions,
) -> Result<(Model<R>, model::LoadReport), ModelError> {
    let mut calls = 0usize;
    let mut last = (0u64, 0u64);
    let result = Model::<R>::load(client, dir, options, &mut |p| {
        calls += 1;
        assert_eq!(p.index, calls);
        assert!(p.bytes_done > last.0 && p.bytes_done <= p.bytes_total);
        last = (p.bytes_done, p.bytes_total);
    });
    if let Ok((m, _)) = &result {
        let compressed = m.projections().filter(|p| !p.is_dense()).count();
        // A compressed projection with a bias also reads its bias group; a compressed tied head
        // is made from the embedding table's one read.
        let biases = m
            .projections()
            .filter(|p| !p.is_dense() && p.has_bias())
            .count();
        let tied_head = m.config().tie_word_embeddings && m.lm_head.is_some();
        assert_eq!(
            calls + usize::from(tied_head),
            m.weights().len() + compressed + biases,
            "one progress call per tensor"
        );
        assert_eq!(last.0, last.1, "progress ends at the total");
    }
    result
}

/// Every uploaded weight equals the checkpoint's values converted on the host.
pub fn assert_weights_match<R: Runtime>(
    client: &ComputeClient<R>,
    m: &Model<R>,
    dir: &std::path::Path,
) {
    let store = WeightStore::open(dir).unwrap();
    for w in m.weights() {
        // Fused weights are their parts concatenated along the first dimension.
        let mut want = Vec::new();
        let mut rows = 0;
        let mut cols = Vec::new();
        for part in &w.parts {
            let t = store.get(part).unwrap();
            want.extend_from_slice(&t.bytes_as(m.dtype()).unwrap());
            rows += t.shape[0];
            cols = t.shape[1..].to_vec();
        }
        let mut shape = vec![rows];
        shape.extend(cols);
        assert_eq!(w.tensor.shape(), shape.as_slice(), "{}", w.name);
        assert_eq!(w.tensor.dtype(), m.dtype(), "{}", w.name);
        let got = w.tensor.to_bytes(client).unwrap();
        assert!(got == want, "{} differs after upload", w.name);
    }
}

/// The reference of a transformers fixture (see scripts/make_hf_fixtures.py).
pub struct Reference {
    pub prompt: Vec<u32>,
    pub logits: Vec<f32>,
    pub greedy: Vec<u32>,
    pub greedy_logits: Vec<f32>,
    pub vocab: usize,
    /// `reference.json`: the largest |logit| difference of transformers itself run in bf16 and
    /// f16 against its f32 run (how sensitive the fixture is to the precision, whatever the
    /// implementation).
    pub transformers_bf16_error: f64,
    pub transformers_f16_error: f64,
}

pub fn reference(dir: &std::path::Path) -> Reference {
    let store = WeightStore::open_file(&dir.join("reference.safetensors")).unwrap();
    let ids = |n: &str| {
        store
            .i32s(n)
            .unwrap()
            .into_iter()
            .map(|v| v as u32)
            .collect::<Vec<_>>()
    };
    let logits = store.get("logits").unwrap();
    let vocab = logits.shape[1];
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let own = &json["max_abs_logit_error_of_transformers_in"];
    Reference {
        prompt: ids("prompt_ids"),
        logits: logits.to_f32().unwrap(),
        greedy: ids("greedy_ids"),
        greedy_logits: store.get("greedy_logits").unwrap().to_f32().unwrap(),
        vocab,
        transformers_bf16_error: own["torch.bfloat16"].as_f64().unwrap_or(0.0),
        transformers_f16_error: own["torch.float16"].as_f64().unwrap_or(0.0),
    }
}

/// `||got - want|| / ||want||` over each row of `vocab` logits: the worst row.
pub fn worst_row_error(got: &[f32], want: &[f32], vocab: usize) -> f64 {
    got.chunks(vocab)
        .zip(want.chunks(vocab))
        .map(|(g, w)| {
            let num: f64 = g
                .iter()
                .zip(w)
                .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
                .sum();
            let den: f64 = w.iter().map(|b| (*b as f64).powi(2)).sum();
            if num.is_nan() {
                f64::INFINITY
            } else {
                (num / den.max(1e-30)).sqrt()
            }
        })
        .fold(0.0, f64::max)
}

/// Logit tolerance (relative L2 per position) by compute dtype, against transformers in f32.
pub fn logit_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 5e-3,
        _ => 2e-2,
    }
}

/// Checks logits computed in `dtype` against transformers' f32 logits (rows of `r.vocab`): each
/// row within [`logit_tolerance`] (relative L2), or, where transformers itself strays further in
/// that dtype, with a largest absolute error at most twice transformers' own (the measure of
/// `reference.json`; on the fixtures with q/k norms transformers strays 0.19-0.24 in bf16,
/// against 0.08 on Qwen2). Returns the worst relative error and the worst absolute error.
pub fn check_fixture_logits(
    what: &str,
    dtype: DType,
    r: &Reference,
    got: &[f32],
    want: &[f32],
) -> (f64, f64) {
    let own = match dtype {
        DType::F32 => 0.0,
        DType::F16 => r.transformers_f16_error,
        _ => r.transformers_bf16_error,
    };
    let (mut worst_rel, mut worst_abs) = (0f64, 0f64);
    for (row, (g, w)) in got.chunks(r.vocab).zip(want.chunks(r.vocab)).enumerate() {
        let rel = worst_row_error(g, w, r.vocab);
        let abs = g
            .iter()
            .zip(w)
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .fold(
                0f64,
                |m, d| if d.is_nan() { f64::INFINITY } else { m.max(d) },
            );
        assert!(
            rel <= logit_tolerance(dtype) || abs <= 2.0 * own,
            "{what}, row {row}: relative error {rel:.3e} > {:.0e} and largest error {abs:.3} > \
             2 x transformers' own {own:.3}",
            logit_tolerance(dtype)
        );
        worst_rel = worst_rel.max(rel);
        worst_abs = worst_abs.max(abs);
    }
    (worst_rel, worst_abs)
}
