//! Model tests that need a device: loading real checkpoints onto every runtime present (wgpu on
//! lavapipe in CI, CUDA on the GPU machine), the dtype policy, KV cache and decode buffers, and
//! the comparison with the transformers fixtures.
//!
//! `CUBELLM_TEST_RUNTIMES=cuda` (or `wgpu`) restricts the runtimes, as for the kernel tests.

use std::path::PathBuf;

use cubecl::prelude::*;
use model::{
    CausalLm, DecodeBuffers, GenerateOptions, Generator, KvCache, LoadOptions, ModelError, Prompt,
    Qwen2Model, Qwen2Session, Tokenizer, WeightStore,
};
use ops::{caps, DType};

use testkit::on_each_runtime_one_cuda_at_a_time;

/// A committed fixture, found from the working directory first (the test binary may run from the
/// repository root of a checkout at another path, e.g. on the GPU machine; `cargo test` runs it
/// from this crate's directory), else from this crate's source dir.
fn fixture(name: &str) -> PathBuf {
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

struct Demo(PathBuf);

impl Demo {
    fn new() -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "cubellm-model-device-demo-{}-{n}",
            std::process::id()
        ));
        model::demo::ensure_demo_model_in(&dir).unwrap();
        Demo(dir)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load<R: Runtime>(
    client: &ComputeClient<R>,
    dir: &std::path::Path,
    options: &LoadOptions,
) -> Result<(Qwen2Model<R>, model::LoadReport), ModelError> {
    let mut calls = 0usize;
    let mut last = (0u64, 0u64);
    let result = Qwen2Model::<R>::load(client, dir, options, &mut |p| {
        calls += 1;
        assert_eq!(p.index, calls);
        assert!(p.bytes_done > last.0 && p.bytes_done <= p.bytes_total);
        last = (p.bytes_done, p.bytes_total);
    });
    if let Ok((m, _)) = &result {
        let compressed = m.projections().filter(|p| !p.is_dense()).count();
        // A compressed qkv projection also reads its bias group; a compressed tied head is made
        // from the embedding table's one read.
        let biases = m.layers.iter().filter(|l| !l.qkv_proj.is_dense()).count();
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
fn assert_weights_match<R: Runtime>(
    client: &ComputeClient<R>,
    m: &Qwen2Model<R>,
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

fn demo_loads<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let (m, report) = load(client, &demo.0, &LoadOptions::default()).unwrap();
    assert_eq!(report.dtype, DType::F32);
    assert_eq!(report.checkpoint_dtype, DType::F32);
    assert!(report.notices.is_empty(), "{:?}", report.notices);
    assert_eq!(report.max_len, model::demo::MAX_POSITIONS);
    assert_eq!(m.layers.len(), model::demo::LAYERS);
    assert!(m.lm_head.is_none(), "tied embeddings use embed_tokens");
    assert_eq!(report.weight_bytes, report.dense_weight_bytes);
    assert_eq!(
        m.layers[1].qkv_proj.parts(),
        ["q", "k", "v"].map(|p| format!("model.layers.1.self_attn.{p}_proj.weight"))
    );
    assert_weights_match(client, &m, &demo.0);
    // f16 on request: converted on the host.
    let (m, report) = load(
        client,
        &demo.0,
        &LoadOptions {
            dtype: Some(DType::F16),
            max_len: Some(64),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!((report.dtype, report.max_len), (DType::F16, 64));
    assert_weights_match(client, &m, &demo.0);
}

#[test]
fn demo_model_loads_on_every_runtime() {
    on_each_runtime_one_cuda_at_a_time!(demo_loads);
}

fn bf16_checkpoint_dtype_policy<R: Runtime>(client: &ComputeClient<R>) {
    let dir = fixture("qwen2-gqa-untied");
    let (m, report) = load(client, &dir, &LoadOptions::default()).unwrap();
    assert_eq!(report.checkpoint_dtype, DType::BF16);
    if caps::supports_dtype(client, DType::BF16) {
        assert_eq!(report.dtype, DType::BF16);
        assert!(report.notices.is_empty());
    } else {
        // wgpu: f16 with a one-line notice, and an explicit bf16 is an error.
        assert_eq!(report.dtype, DType::F16);
        assert_eq!(report.notices.len(), 1, "{:?}", report.notices);
        assert!(report.notices[0].contains("bf16"));
        let err = load(
            client,
            &dir,
            &LoadOptions {
                dtype: Some(DType::BF16),
                max_len: None,
                ..LoadOptions::default()
            },
        )
        .unwrap_err();
        assert_eq!(err.kind(), "dtype", "{err}");
        assert!(!err.to_string().contains('\n'));
    }
    assert!(m.lm_head.is_some(), "untied");
    assert_weights_match(client, &m, &dir);
    let (m, _) = load(
        client,
        &dir,
        &LoadOptions {
            dtype: Some(DType::F32),
            max_len: None,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_weights_match(client, &m, &dir);
    // Loading errors surface before anything is uploaded.
    let err = load(
        client,
        std::path::Path::new("/no/model/here"),
        &LoadOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), "io");
    let err = load(
        client,
        &dir,
        &LoadOptions {
            dtype: None,
            max_len: Some(0),
            ..LoadOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), "parameter");
}

#[test]
fn bf16_checkpoints_follow_the_dtype_policy() {
    on_each_runtime_one_cuda_at_a_time!(bf16_checkpoint_dtype_policy);
}

fn cache_and_buffers<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let (m, _) = load(
        client,
        &demo.0,
        &LoadOptions {
            dtype: None,
            max_len: Some(10),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let c = m.config().clone();
    let mut cache = m.new_cache().unwrap();
    assert_eq!(cache.layers().len(), c.num_hidden_layers);
    assert_eq!(
        cache.layer(0).k.shape(),
        &[10, c.num_key_value_heads, c.head_dim]
    );
    assert_eq!(cache.layer(1).v.dtype(), m.dtype());
    assert_eq!(
        KvCache::<R>::bytes_for(&c, 10, DType::F32),
        2 * c.num_hidden_layers * 10 * c.kv_dim() * 4
    );
    cache.advance(7).unwrap();
    cache.sync_len(client).unwrap();
    assert_eq!(cache.len_buffer().to_vec::<u32>(client).unwrap(), vec![7]);
    let err = cache.advance(4).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::ContextOverflow {
                needed: 11,
                max_len: 10
            }
        ),
        "{err}"
    );
    assert_eq!(cache.len(), 7, "a refused advance changes nothing");
    cache.advance(3).unwrap();
    cache.reset(client).unwrap();
    assert_eq!(cache.len_buffer().to_vec::<u32>(client).unwrap(), vec![0]);

    let step = DecodeBuffers::<R>::new(client, &c, m.dtype(), 10).unwrap();
    step.write_inputs(client, 42, 9).unwrap();
    assert_eq!(step.token.to_vec::<u32>(client).unwrap(), vec![42]);
    assert_eq!(step.position.to_vec::<u32>(client).unwrap(), vec![9]);
    assert_eq!(step.kv_len.to_vec::<u32>(client).unwrap(), vec![10]);
    assert_eq!(step.logits.shape(), &[1, c.vocab_size]);
    assert_eq!(step.q.shape(), &[1, c.num_attention_heads, c.head_dim]);
}

#[test]
fn kv_cache_and_decode_buffers() {
    on_each_runtime_one_cuda_at_a_time!(cache_and_buffers);
}

fn session_limits<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let (m, _) = load(
        client,
        &demo.0,
        &LoadOptions {
            dtype: None,
            max_len: Some(8),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let config = m.config().clone();
    let tok = Tokenizer::from_dir(&demo.0, &config, m.generation_config()).unwrap();
    let session = Qwen2Session::new(m).unwrap();
    assert_eq!(
        (session.max_len(), session.vocab_size()),
        (8, config.vocab_size)
    );
    let mut g = Generator::new(session, tok);
    // A prompt longer than the context: a clear error, nothing runs.
    let long = Prompt::Tokens((0..9).collect());
    let err = g
        .generate(&long, &GenerateOptions::default(), |_| {
            std::ops::ControlFlow::Continue(())
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::ContextOverflow {
                needed: 9,
                max_len: 8
            }
        ),
        "{err}"
    );
    // Token ids outside the vocabulary never reach a kernel.
    let err = g
        .model_mut()
        .prefill(&[config.vocab_size as u32])
        .unwrap_err();
    assert_eq!(err.kind(), "parameter");
    let err = g.model_mut().decode(u32::MAX).unwrap_err();
    assert_eq!(err.kind(), "parameter");
    // Generation that fills the context stops cleanly at it, with text streamed.
    let mut streamed = String::new();
    let out = g
        .generate(
            &Prompt::Text("Hello".into()),
            &GenerateOptions {
                max_new_tokens: 100,
                ..GenerateOptions::default()
            },
            |t| {
                streamed.push_str(t);
                std::ops::ControlFlow::Continue(())
            },
        )
        .unwrap();
    // The last token is sampled from the final logits and never fed back: one past the cache.
    assert_eq!(
        out.prompt_tokens.len() + out.tokens.len(),
        9,
        "stops at the context length"
    );
    assert_eq!(out.text, streamed);
}

#[test]
fn session_validates_before_the_forward_pass() {
    on_each_runtime_one_cuda_at_a_time!(session_limits);
}

/// The reference of a transformers fixture (see scripts/make_hf_fixtures.py).
struct Reference {
    prompt: Vec<u32>,
    logits: Vec<f32>,
    greedy: Vec<u32>,
    greedy_logits: Vec<f32>,
    vocab: usize,
}

fn reference(dir: &std::path::Path) -> Reference {
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
    Reference {
        prompt: ids("prompt_ids"),
        logits: logits.to_f32().unwrap(),
        greedy: ids("greedy_ids"),
        greedy_logits: store.get("greedy_logits").unwrap().to_f32().unwrap(),
        vocab,
    }
}

/// `||got - want|| / ||want||` over each row of `vocab` logits: the worst row.
fn worst_row_error(got: &[f32], want: &[f32], vocab: usize) -> f64 {
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

const FIXTURES: [&str; 5] = [
    "qwen2-gqa-untied",
    "qwen25-tied-theta1e6",
    "qwen2-1layer",
    "qwen2-4layer",
    "qwen2-odd-vocab",
];

/// Logit tolerance (relative L2 per position) by compute dtype, against transformers in f32.
fn logit_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 5e-3,
        _ => 2e-2,
    }
}

fn matches_transformers<R: Runtime>(client: &ComputeClient<R>) {
    let mut dtypes = vec![DType::F32, DType::F16];
    if caps::supports_dtype(client, DType::BF16) {
        dtypes.push(DType::BF16);
    }
    for name in FIXTURES {
        let dir = fixture(name);
        let r = reference(&dir);
        for &dtype in &dtypes {
            let what = format!("{name} {dtype} on {}", caps::runtime_name(client));
            let opts = LoadOptions {
                dtype: Some(dtype),
                max_len: Some(128),
                ..LoadOptions::default()
            };
            let (m, _) = load(client, &dir, &opts).unwrap();
            assert_eq!(m.config().vocab_size, r.vocab, "{what}");
            let mut session = Qwen2Session::new(m).unwrap();
            // Prefill: every prompt position's logits.
            let got = session
                .prefill_all_logits(&r.prompt)
                .unwrap()
                .to_f32_vec(client)
                .unwrap();
            let err = worst_row_error(&got, &r.logits, r.vocab);
            eprintln!("{what}: prefill logits relative error {err:.2e}");
            assert!(
                err <= logit_tolerance(dtype),
                "{what}: prefill logits relative error {err:.3e}"
            );
            // Greedy decoding, step by step through the decode path: ids and logits.
            session.reset().unwrap();
            session.prefill(&r.prompt).unwrap();
            let mut logits = Vec::new();
            let mut worst = 0f64;
            for (i, &want) in r.greedy.iter().enumerate() {
                let next = session.argmax().unwrap();
                assert_eq!(next, want, "{what}: greedy token {i}");
                session.logits(&mut logits).unwrap();
                let step_err = worst_row_error(
                    &logits,
                    &r.greedy_logits[i * r.vocab..(i + 1) * r.vocab],
                    r.vocab,
                );
                worst = worst.max(step_err);
                session.decode(next).unwrap();
            }
            eprintln!("{what}: 32 greedy tokens match, decode logits relative error {worst:.2e}");
            assert!(
                worst <= logit_tolerance(dtype),
                "{what}: decode logits relative error {worst:.3e}"
            );
        }
    }
}

#[test]
fn logits_and_greedy_tokens_match_transformers() {
    on_each_runtime_one_cuda_at_a_time!(matches_transformers);
}

/// Teacher-forced quality of `got` logits against the float reference `want`, per position:
/// how often the top-1 token is the same, and the mean KL(want || got) of the next-token
/// distributions.
fn agreement_and_kl(got: &[f32], want: &[f32], vocab: usize) -> (f64, f64) {
    let log_softmax = |row: &[f32]| -> Vec<f64> {
        let m = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
        let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        row.iter().map(|&v| v as f64 - lse).collect()
    };
    let argmax = |row: &[f32]| (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
    let (mut same, mut kl, mut n) = (0usize, 0f64, 0usize);
    for (g, w) in got.chunks(vocab).zip(want.chunks(vocab)) {
        same += usize::from(argmax(g) == argmax(w));
        let (lg, lw) = (log_softmax(g), log_softmax(w));
        kl += lw
            .iter()
            .zip(&lg)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
        n += 1;
    }
    (same as f64 / n as f64, kl / n as f64)
}

/// The decode path (preallocated buffers, one token at a time) gives the same logits as the
/// prefill path on the same tokens: checks the compressed projections' scratch handling.
fn decode_matches_prefill<R: Runtime>(
    client: &ComputeClient<R>,
    session: &mut Qwen2Session<R>,
    prompt: &[u32],
    then: &[u32],
    what: &str,
) {
    let all: Vec<u32> = prompt.iter().chain(then).copied().collect();
    session.reset().unwrap();
    let vocab = session.vocab_size();
    let full = session
        .prefill_all_logits(&all)
        .unwrap()
        .to_f32_vec(client)
        .unwrap();
    session.reset().unwrap();
    session.prefill(prompt).unwrap();
    let mut logits = Vec::new();
    for (i, &t) in then.iter().enumerate() {
        session.decode(t).unwrap();
        session.logits(&mut logits).unwrap();
        let row = prompt.len() + i;
        let err = worst_row_error(&logits, &full[row * vocab..(row + 1) * vocab], vocab);
        assert!(
            err < 1e-4,
            "{what}: decode step {i} differs from prefill by {err:.2e}"
        );
    }
}

/// Bounds on the quantized models' next-token distributions against the float model on the
/// fixtures (random weights, f32 compute, measured on wgpu: W8A8 KL 5e-4..2e-3, FP8 7e-3..3e-2,
/// W4A16 6e-2..0.36): int8 keeps ~7 bits per value, e4m3 ~4, int4 ~3.
const W8A8_MAX_KL: f64 = 1e-2;
const FP8_MAX_KL: f64 = 5e-2;
const W4A16_MAX_KL: f64 = 0.5;
/// Minimum top-1 agreement (teacher-forced, over the prompt positions) per format.
const W8A8_MIN_TOP1: f64 = 0.85;
const FP8_MIN_TOP1: f64 = 0.8;
const W4A16_MIN_TOP1: f64 = 0.4;

fn compressed_models<R: Runtime>(client: &ComputeClient<R>) {
    use model::{Compression, Int4Group, QuantMode};
    for name in ["qwen2-gqa-untied", "qwen25-tied-theta1e6"] {
        let dir = fixture(name);
        let r = reference(&dir);
        let runtime = caps::runtime_name(client);
        for (compression, max_kl, min_top1) in [
            // No block dropped: the block-sparse kernel must reproduce the float model.
            (Compression::Sparsify { sparsity: 0.0 }, 1e-6, 1.0),
            (Compression::Sparsify { sparsity: 0.5 }, f64::INFINITY, 0.0),
            (
                Compression::Quant {
                    mode: QuantMode::W8A8,
                    lm_head: false,
                },
                W8A8_MAX_KL,
                W8A8_MIN_TOP1,
            ),
            (
                Compression::Quant {
                    mode: QuantMode::W8A8,
                    lm_head: true,
                },
                W8A8_MAX_KL,
                W8A8_MIN_TOP1,
            ),
            (
                Compression::Quant {
                    mode: QuantMode::Fp8,
                    lm_head: true,
                },
                FP8_MAX_KL,
                FP8_MIN_TOP1,
            ),
            (
                Compression::Quant {
                    mode: QuantMode::W4A16 {
                        group: Int4Group::Auto,
                    },
                    lm_head: true,
                },
                W4A16_MAX_KL,
                W4A16_MIN_TOP1,
            ),
            (
                Compression::Quant {
                    mode: QuantMode::W4A16 {
                        group: Int4Group::PerChannel,
                    },
                    lm_head: false,
                },
                W4A16_MAX_KL,
                W4A16_MIN_TOP1,
            ),
        ] {
            let what = format!("{name} {compression:?} on {runtime}");
            let opts = LoadOptions {
                dtype: Some(DType::F32),
                max_len: Some(128),
                compression,
            };
            let (m, report) = load(client, &dir, &opts).unwrap();
            let sparse_bytes = report.weight_bytes;
            assert!(
                m.layers.iter().all(|l| !l.gate_up_proj.is_dense()),
                "{what}"
            );
            if let Compression::Quant { lm_head, .. } = compression {
                let head_quantized = m.lm_head.as_ref().is_some_and(|p| !p.is_dense());
                assert_eq!(head_quantized, lm_head, "{what}");
                assert!(m.layers.iter().all(|l| !l.qkv_proj.is_dense()), "{what}");
                assert!(sparse_bytes < report.dense_weight_bytes, "{what}");
            }
            let mut session = Qwen2Session::new(m).unwrap();
            let got = session
                .prefill_all_logits(&r.prompt)
                .unwrap()
                .to_f32_vec(client)
                .unwrap();
            assert!(got.iter().all(|v| v.is_finite()), "{what}");
            let (top1, kl) = agreement_and_kl(&got, &r.logits, r.vocab);
            eprintln!(
                "{what}: top-1 agreement {:.1}%, mean KL {kl:.2e}, weights {} of {} bytes",
                top1 * 100.0,
                sparse_bytes,
                report.dense_weight_bytes
            );
            assert!(kl <= max_kl, "{what}: mean KL {kl:.3e}");
            assert!(top1 >= min_top1, "{what}: top-1 agreement {top1:.3}");
            if let Compression::Sparsify { sparsity } = compression {
                if sparsity == 0.0 {
                    let err = worst_row_error(&got, &r.logits, r.vocab);
                    assert!(err <= logit_tolerance(DType::F32), "{what}: {err:.2e}");
                } else {
                    assert!(sparse_bytes < report.dense_weight_bytes, "{what}");
                }
            }
            decode_matches_prefill(client, &mut session, &r.prompt, &r.greedy[..6], &what);
        }
    }
    // Out-of-range ratios are refused before anything is uploaded.
    let dir = fixture("qwen2-1layer");
    for bad in [-0.1, 1.0, f64::NAN] {
        let opts = LoadOptions {
            compression: Compression::Sparsify { sparsity: bad },
            ..LoadOptions::default()
        };
        let err = Qwen2Model::<R>::load(client, &dir, &opts, &mut |_| {}).unwrap_err();
        assert_eq!(err.kind(), "parameter", "{err}");
    }
}

#[test]
fn compressed_models_track_the_float_model() {
    on_each_runtime_one_cuda_at_a_time!(compressed_models);
}
