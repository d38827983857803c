//! `ops::attention` against the f64 reference: every kernel on a grid of Lq x Lk x heads x D x
//! causal, forced one by one where the runtime has it (elsewhere the `feature` error is
//! asserted), the KV-cache paths with host and device lengths and a reused workspace, and the
//! validation errors.

mod cache;
mod decode;
mod errors;
mod prefill;
mod ragged;
mod rope_decode;

use cubecl::prelude::*;
use ops::attention::{attention_into_with, AttentionStrategy, FlashTiling, SplitKvTiling};
use ops::{caps, reference, DType};
use rand::rngs::StdRng;
use testkit::*;

/// Tolerances by dtype, relative to the output (|want| + rms(want)).
fn attn_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        DType::BF16 => 2e-2,
        _ => 0.0,
    }
}

fn is_cuda<R: Runtime>(client: &ComputeClient<R>) -> bool {
    caps::runtime_name(client).contains("cuda")
}

/// Values in [-1, 1] that bf16, f16 and f32 all hold exactly, so that one f64 reference serves
/// every dtype of a shape.
fn exact_values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    random(rng, n, 1.0)
        .into_iter()
        .map(|x| {
            let b = half::bf16::from_f32(x).to_f32();
            if b.abs() < 1e-4 {
                0.25
            } else {
                b
            }
        })
        .collect()
}

struct Shape {
    batch: usize,
    lq: usize,
    lk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
}

impl Shape {
    fn new(lq: usize, lk: usize, hq: usize, hkv: usize, d: usize, causal: bool) -> Self {
        Self {
            batch: 1,
            lq,
            lk,
            hq,
            hkv,
            d,
            causal,
        }
    }

    fn name(&self) -> String {
        format!(
            "b{} lq{} lk{} h{}/{} d{}{}",
            self.batch,
            self.lq,
            self.lk,
            self.hq,
            self.hkv,
            self.d,
            if self.causal { " causal" } else { "" }
        )
    }

    fn q_shape(&self) -> Vec<usize> {
        let s = vec![self.lq, self.hq, self.d];
        if self.batch > 1 {
            [vec![self.batch], s].concat()
        } else {
            s
        }
    }

    fn k_shape(&self) -> Vec<usize> {
        let s = vec![self.lk, self.hkv, self.d];
        if self.batch > 1 {
            [vec![self.batch], s].concat()
        } else {
            s
        }
    }
}

/// Inputs of a shape and their reference output (computed once for every dtype).
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    want: Vec<f64>,
    scale: f32,
}

fn inputs(rng: &mut StdRng, s: &Shape) -> Inputs {
    let q = exact_values(rng, s.batch * s.lq * s.hq * s.d);
    let k = exact_values(rng, s.batch * s.lk * s.hkv * s.d);
    let v = exact_values(rng, s.batch * s.lk * s.hkv * s.d);
    // A scale above 1/sqrt(d) sharpens the softmax so that masking mistakes show.
    let scale = 2.0 / (s.d as f32).sqrt();
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let want = reference::attention::attention_batched(
        &f(&q),
        &f(&k),
        &f(&v),
        s.batch,
        s.lq,
        s.lk,
        s.hq,
        s.hkv,
        s.d,
        scale as f64,
        s.causal,
    );
    Inputs {
        q,
        k,
        v,
        want,
        scale,
    }
}

fn check<R: Runtime>(
    client: &ComputeClient<R>,
    s: &Shape,
    x: &Inputs,
    dtype: DType,
    strategy: AttentionStrategy,
) {
    let (q, _) = upload(client, &x.q, &s.q_shape(), dtype);
    let (k, _) = upload(client, &x.k, &s.k_shape(), dtype);
    let (v, _) = upload(client, &x.v, &s.k_shape(), dtype);
    let out = poisoned(client, &s.q_shape(), dtype);
    attention_into_with(client, &q, &k, &v, x.scale, s.causal, &out, strategy)
        .unwrap_or_else(|e| panic!("{} {dtype} {strategy:?}: {e}", s.name()));
    assert_close(
        &format!("attention {} {dtype} {strategy:?}", s.name()),
        &out.to_f64_vec(client).unwrap(),
        &x.want,
        attn_tol(dtype),
    );
}

/// Every forced kernel other than `Tiled`, the tensor-core ones also with other tile shapes than
/// the defaults (as a benchmark sweep passes them).
fn forced_strategies() -> [AttentionStrategy; 7] {
    [
        AttentionStrategy::TensorCore(FlashTiling::default()),
        AttentionStrategy::TensorCore(FlashTiling { warps: 2, bk: 32 }),
        AttentionStrategy::Decode,
        AttentionStrategy::TensorCoreDecode(SplitKvTiling::default()),
        AttentionStrategy::TensorCoreDecode(SplitKvTiling {
            warps: 2,
            bk: 64,
            cubes_per_sm: 2,
        }),
        // The long-context tiling of `Auto` (128-key tiles, eight planes), and with four.
        AttentionStrategy::TensorCoreDecode(SplitKvTiling {
            warps: 8,
            bk: 128,
            cubes_per_sm: 1,
        }),
        AttentionStrategy::TensorCoreDecode(SplitKvTiling {
            warps: 4,
            bk: 128,
            cubes_per_sm: 1,
        }),
    ]
}
