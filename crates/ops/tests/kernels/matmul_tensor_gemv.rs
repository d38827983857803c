//! The tensor-core GEMV (`MatmulStrategy::TensorGemv`, CUDA f16/bf16) against the f64
//! references: every epilogue, both gates and the fused input norm, on shapes where K is not a
//! multiple of a chunk or of the split, N is not a multiple of the 8-column group, M = 1 and 16,
//! and rows on both halves of the 16-row tile; K split over a cube's planes, looped over, and
//! split across cubes through a scratch. Elsewhere it must refuse with `UnsupportedFeature`.

use cubecl::prelude::*;
use ops::gemm::{SplitNeed, SplitScratch};
use ops::matmul::{
    fused_gated_mlp_opts_into, linear_into_with, linear_opts_into, plan, Activation, GatedWeights,
    InputNorm, Kernel, MatmulStrategy, ProductOptions, TensorGemvShape,
};
use ops::reference::matmul as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

use super::matmul::linear_operands;

const EPS: f32 = 1e-6;

const fn shape(splits: u32, vectors: u32, tiles: u32, cube_splits: u32) -> Option<TensorGemvShape> {
    Some(TensorGemvShape {
        splits,
        vectors,
        tiles,
        cube_splits,
    })
}

/// (M, N, K, shape): K = 8 (one vector), 72 and 200 (partial slices), 1000, 4104 and 8960
/// (slices not a multiple of the planes, several passes, split across 3 to 7 cubes); N from 5
/// to 8960, mostly not a multiple of 8 or 16; one and two column tiles per plane.
const CASES: [(usize, usize, usize, Option<TensorGemvShape>); 13] = [
    (1, 37, 72, shape(1, 1, 1, 1)),
    (16, 5, 1000, shape(16, 2, 1, 1)),
    (3, 11, 4104, shape(4, 4, 2, 1)),
    (9, 130, 200, shape(2, 2, 2, 1)),
    (8, 64, 8, shape(8, 1, 1, 1)),
    (12, 21, 264, shape(1, 2, 2, 1)),
    (16, 1000, 1536, None),
    (1, 8960, 1536, None),
    (1, 37, 1000, shape(2, 2, 1, 3)),
    (16, 21, 4104, shape(4, 8, 1, 5)),
    (9, 64, 200, shape(1, 1, 2, 7)),
    (3, 130, 8960, None),
    (12, 8, 2048, shape(16, 4, 1, 2)),
];

/// The dtypes the kernel runs here (f16 and bf16 on CUDA sm_80+), or none after checking that
/// it refuses with `UnsupportedFeature`.
fn mma_dtypes<R: Runtime>(client: &ComputeClient<R>) -> Vec<DType> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        if !ops::caps::supports_dtype(client, dtype) {
            continue;
        }
        let x = DeviceTensor::from_f32(client, &[0.5; 16], &[1, 16], dtype).unwrap();
        let w = DeviceTensor::from_f32(client, &[0.5; 64], &[4, 16], dtype).unwrap();
        let o = DeviceTensor::empty(client, &[1, 4], dtype);
        match linear_into_with(
            client,
            &x,
            &w,
            None,
            None,
            &o,
            MatmulStrategy::TensorGemv(None),
        ) {
            Ok(()) => out.push(dtype),
            Err(e) => {
                assert_eq!(e.kind(), "feature", "{e}");
                assert_ne!(plan(client, 1, 16, dtype), Kernel::TensorGemv);
            }
        }
    }
    if out.is_empty() {
        eprintln!(
            "tensor-core GEMV skipped on {}: no mma m16n8k16",
            ops::caps::runtime_name(client)
        );
    }
    out
}

/// `x · rstd · g` per row, in f64 (the kernels fold the norm into their f32 sums).
fn normed(xh: &[f64], gh: &[f64]) -> Vec<f64> {
    let k = gh.len();
    let mut out = Vec::with_capacity(xh.len());
    for row in xh.chunks(k) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / k as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        out.extend(row.iter().zip(gh).map(|(v, g)| v * inv * g));
    }
    out
}

fn tensor_gemv_case<R: Runtime>(client: &ComputeClient<R>) {
    let dtypes = mma_dtypes(client);
    let mut rng = rng(131);
    for dtype in dtypes {
        // x · g is rounded to the dtype once before the mma: one more rounding than the
        // reference, which f16's 1e-3 bound does not leave room for.
        let tol = 2.0 * tolerance(dtype);
        for (ci, (m, n, k, shape)) in CASES.into_iter().enumerate() {
            let strategy = MatmulStrategy::TensorGemv(shape);
            let mut xs = random(&mut rng, m * k, 1.0);
            // Rows of different scale, so that a wrong row statistic shows.
            for (r, row) in xs.chunks_mut(k).enumerate() {
                row.iter_mut().for_each(|v| *v *= 0.25 + r as f32 / 4.0);
            }
            let (x, xh) = upload(client, &xs, &[m, k], dtype);
            let [(w, wh), (b, bh), (r, rh)] = linear_operands(client, &mut rng, (m, n, k), dtype);
            let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
            // With a scratch K may be split across cubes; without one only a shape that keeps
            // K in one cube runs (the others are refused: see the errors case).
            let split = SplitScratch::new(client, need(client, shape, 2 * n, k));
            let mut scratches = vec![Some(&split)];
            if shape.is_none_or(|s| s.cube_splits == 1) {
                scratches.push(None);
            }
            for scratch in scratches {
                let opts = ProductOptions {
                    strategy,
                    split_k: scratch,
                    rows_invariant: false,
                };
                let what = format!(
                    "{dtype} {m}x{n}x{k} {shape:?} scratch={}",
                    scratch.is_some()
                );
                for (bias, res) in [(false, false), (true, false), (false, true), (true, true)] {
                    let out = poisoned(client, &[m, 2 * n], dtype);
                    let (bo, ro) = (bias.then_some(&b), res.then_some(&r));
                    linear_opts_into(client, &x, None, &w, bo, ro, &out, opts).unwrap();
                    let (bw, rw) = (bias.then_some(&bh[..]), res.then_some(&rh[..]));
                    let want = reference::linear(&xh, &wh, bw, rw, (m, 2 * n, k));
                    let got = out.to_f64_vec(client).unwrap();
                    assert_close(
                        &format!("linear {what} bias={bias} res={res}"),
                        &got,
                        &want,
                        tol,
                    );
                }
                let act = [Activation::Silu, Activation::Gelu][ci % 2];
                let gelu = act == Activation::Gelu;
                let out = poisoned(client, &[m, n], dtype);
                let gw = GatedWeights::Concatenated(&w);
                fused_gated_mlp_opts_into(client, &x, None, gw, act, &out, opts).unwrap();
                let want = reference::gated_mlp(&xh, &wh[..n * k], &wh[n * k..], gelu, (m, n, k));
                let got = out.to_f64_vec(client).unwrap();
                assert_close(&format!("gated {act:?} {what}"), &got, &want, 2.0 * tol);

                let norm = InputNorm {
                    weight: &g,
                    eps: EPS,
                };
                let h = normed(&xh, &gh);
                let normed_buf = poisoned(client, &[m, k], dtype);
                let with_norm = Some((norm, &normed_buf));
                let out = poisoned(client, &[m, 2 * n], dtype);
                linear_opts_into(client, &x, with_norm, &w, Some(&b), None, &out, opts).unwrap();
                let want = reference::linear(&h, &wh, Some(&bh), None, (m, 2 * n, k));
                let got = out.to_f64_vec(client).unwrap();
                assert_close(&format!("normed {what}"), &got, &want, tol);
                let out = poisoned(client, &[m, n], dtype);
                let gw = GatedWeights::Concatenated(&w);
                fused_gated_mlp_opts_into(client, &x, with_norm, gw, act, &out, opts).unwrap();
                let want = reference::gated_mlp(&h, &wh[..n * k], &wh[n * k..], gelu, (m, n, k));
                let got = out.to_f64_vec(client).unwrap();
                assert_close(
                    &format!("gated normed {act:?} {what}"),
                    &got,
                    &want,
                    2.0 * tol,
                );
            }
        }
    }
}

/// What the case's products over a `[rows, k]` weight need of a split-K scratch: the forced
/// shape's need (plain or gated, normed), else the automatic shapes'.
fn need<R: Runtime>(
    client: &ComputeClient<R>,
    shape: Option<TensorGemvShape>,
    rows: usize,
    k: usize,
) -> SplitNeed {
    match shape {
        Some(s) => s
            .split_need(rows, false, true)
            .max(s.split_need(rows / 2, true, true)),
        None => ops::matmul::scratch_need(client, rows, k),
    }
}

/// The kernel's refusals: a 17th row, a shape outside its values, K not a multiple of 8, f32.
fn tensor_gemv_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let Some(&dtype) = mma_dtypes(client).first() else {
        return;
    };
    let t = |shape: &[usize], dtype| {
        let n = shape.iter().product();
        DeviceTensor::from_f32(client, &vec![0.5; n], shape, dtype).unwrap()
    };
    let run = |x: &DeviceTensor<R>, w: &DeviceTensor<R>, out: &DeviceTensor<R>, s| {
        linear_into_with(client, x, w, None, None, out, MatmulStrategy::TensorGemv(s))
    };
    let (x, w, out) = (t(&[3, 64], dtype), t(&[5, 64], dtype), t(&[3, 5], dtype));
    assert!(run(&x, &w, &out, None).is_ok());
    assert_err(
        "splits 17",
        run(&x, &w, &out, shape(17, 2, 1, 1)),
        "argument",
    );
    assert_err(
        "vectors 3",
        run(&x, &w, &out, shape(1, 3, 1, 1)),
        "argument",
    );
    assert_err("tiles 4", run(&x, &w, &out, shape(1, 2, 4, 1)), "argument");
    assert_err(
        "cube_splits 65",
        run(&x, &w, &out, shape(1, 2, 1, 65)),
        "argument",
    );
    // A split across cubes needs a scratch, and one large enough.
    assert_err(
        "no scratch",
        run(&x, &w, &out, shape(1, 1, 1, 2)),
        "argument",
    );
    let small = SplitScratch::new(client, SplitNeed::default());
    let opts = ProductOptions {
        strategy: MatmulStrategy::TensorGemv(shape(1, 1, 1, 2)),
        split_k: Some(&small),
        rows_invariant: false,
    };
    assert_err(
        "small scratch",
        linear_opts_into(client, &x, None, &w, None, None, &out, opts),
        "argument",
    );
    let (x17, o17) = (t(&[17, 64], dtype), t(&[17, 5], dtype));
    assert_err("17 rows", run(&x17, &w, &o17, None), "argument");
    let (xk, wk) = (t(&[3, 60], dtype), t(&[5, 60], dtype));
    assert_err("K = 60", run(&xk, &wk, &out, None), "feature");
    let (xf, wf, of) = (
        t(&[3, 64], DType::F32),
        t(&[5, 64], DType::F32),
        t(&[3, 5], DType::F32),
    );
    assert_err("f32", run(&xf, &wf, &of, None), "feature");
}

#[test]
fn tensor_gemv_matches_reference() {
    on_each_runtime!(tensor_gemv_case);
}

#[test]
fn tensor_gemv_rejects_bad_inputs() {
    on_each_runtime!(tensor_gemv_errors_case);
}
