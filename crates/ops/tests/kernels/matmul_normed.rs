//! Products on an RMSNorm'ed input (`linear_normed_into`, `fused_gated_mlp_normed_into`):
//! fused into the GEMV at decode sizes, a separate norm into the caller's buffer above, both
//! against `rms_norm` then the product in f64.

use cubecl::prelude::*;
use ops::gemm::SplitScratch;
use ops::matmul::{
    fused_gated_mlp_normed_into, fused_gated_mlp_normed_into_with, fused_gated_mlp_opts_into,
    linear_normed_into, linear_normed_into_with, linear_opts_into, plan, Activation, GatedWeights,
    InputNorm, Kernel, MatmulStrategy, ProductOptions, GEMV_MAX_M,
};
use ops::reference::matmul as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

use super::matmul::linear_operands;

const EPS: f32 = 1e-6;

/// (M, N, K): M = 1 and 16 (GEMV), 17 (the unfused path); K not a multiple of the lanes' loads
/// (127: vectors of one element, 33, 200) and the model's 1536; N off the cube's column count.
fn shapes<R: Runtime>(client: &ComputeClient<R>) -> Vec<(usize, usize, usize)> {
    let mut s = vec![(1, 33, 127), (3, 127, 33), (16, 100, 200), (17, 33, 64)];
    if ops::caps::runtime_name(client) == "cuda" {
        s.extend([(1, 2048, 1536), (16, 1000, 1536), (1, 1536, 8960)]);
    }
    s
}

/// The normalized input as the kernels of `m` rows hold it, with rstd in f64: above the GEMV's
/// rows `F(F(x · rstd) · g)`, the rounding of `ops::norm::rms_norm` into the caller's buffer;
/// at GEMV sizes `x · rstd · g` unrounded (the GEMVs apply the norm inside their f32 sums; the
/// tensor-core one rounds `x · g` once, within bf16's bound).
fn normed_input(xh: &[f64], gh: &[f64], dtype: DType, m: usize) -> Vec<f64> {
    let k = gh.len();
    let mut out = Vec::with_capacity(xh.len());
    for row in xh.chunks(k) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / k as f64;
        let inv = 1.0 / (ms + EPS as f64).sqrt();
        if m <= GEMV_MAX_M {
            out.extend(row.iter().zip(gh).map(|(v, g)| v * inv * g));
            continue;
        }
        let scaled: Vec<f32> = row.iter().map(|v| (v * inv) as f32).collect();
        let scaled = round_to(&scaled, dtype);
        let weighted: Vec<f32> = scaled.iter().zip(gh).map(|(s, g)| (s * g) as f32).collect();
        out.extend(round_to(&weighted, dtype));
    }
    out
}

/// The norm's input scale varies per row, so a wrong row statistic shows.
fn input(rng: &mut rand::rngs::StdRng, m: usize, k: usize) -> Vec<f32> {
    let mut x = random(rng, m * k, 1.0);
    for (r, row) in x.chunks_mut(k).enumerate() {
        row.iter_mut().for_each(|v| *v *= 0.25 + r as f32);
    }
    x
}

fn linear_normed_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(91);
    for dtype in float_dtypes(client) {
        for (si, (m, n, k)) in shapes(client).into_iter().enumerate() {
            let (x, xh) = upload(client, &input(&mut rng, m, k), &[m, k], dtype);
            let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
            let (w, wh) = upload(client, &random(&mut rng, n * k, 1.0), &[n, k], dtype);
            let (b, bh) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
            let (r, rh) = upload(client, &random(&mut rng, m * n, 1.0), &[m, n], dtype);
            let (bias, res) = (si % 2 == 0, si % 3 != 1);
            let normed = poisoned(client, &[m, k], dtype);
            let out = poisoned(client, &[m, n], dtype);
            let norm = InputNorm {
                weight: &g,
                eps: EPS,
            };
            let (bias_t, res_t) = (bias.then_some(&b), res.then_some(&r));
            linear_normed_into(client, &x, norm, &normed, &w, bias_t, res_t, &out).unwrap();
            let h = normed_input(&xh, &gh, dtype, m);
            let want = reference::linear(
                &h,
                &wh,
                bias.then_some(&bh[..]),
                res.then_some(&rh[..]),
                (m, n, k),
            );
            let kernel = plan(client, m, k, dtype);
            let what =
                format!("linear_normed {dtype} {m}x{n}x{k} ({kernel:?}) bias={bias} res={res}");
            assert_close(
                &what,
                &out.to_f64_vec(client).unwrap(),
                &want,
                tolerance(dtype),
            );
            if !matches!(kernel, Kernel::Gemv | Kernel::TensorGemv) {
                // The unfused path leaves the norm in `normed`.
                let got = normed.to_f64_vec(client).unwrap();
                assert_close(&format!("{what}: normed"), &got, &h, tolerance(dtype));
            }
        }
    }
}

fn gated_normed_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(92);
    for dtype in float_dtypes(client) {
        // M = 1 and 16 with N off the cube's columns, on every runtime.
        let mut cases = vec![
            (1usize, 96usize, 64usize),
            (1, 45, 127),
            (3, 33, 127),
            (16, 37, 100),
            (17, 40, 40),
        ];
        if ops::caps::runtime_name(client) == "cuda" {
            cases.extend([(1, 8960, 1536), (16, 1000, 1536)]);
        }
        for (m, i, k) in cases {
            let (x, xh) = upload(client, &input(&mut rng, m, k), &[m, k], dtype);
            let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
            let (gu, guh) = upload(
                client,
                &random(&mut rng, 2 * i * k, 1.0),
                &[2 * i, k],
                dtype,
            );
            let normed = poisoned(client, &[m, k], dtype);
            let out = poisoned(client, &[m, i], dtype);
            let norm = InputNorm {
                weight: &g,
                eps: EPS,
            };
            let w = GatedWeights::Concatenated(&gu);
            fused_gated_mlp_normed_into(client, &x, norm, &normed, w, Activation::Silu, &out)
                .unwrap();
            let h = normed_input(&xh, &gh, dtype, m);
            let (gate, up) = guh.split_at(i * k);
            let want = reference::gated_mlp(&h, gate, up, false, (m, i, k));
            let what = format!("gated_normed {dtype} {m}x{i}x{k}");
            // The epilogue rounds gate and up to the dtype before the activation (as two
            // separate linears deliver them): two roundings the f64 reference does not make.
            let tol = 2.0 * tolerance(dtype);
            assert_close(&what, &out.to_f64_vec(client).unwrap(), &want, tol);
        }
    }
}

/// The fused GEMV and the unfused path (norm, then the tiled GEMM) on the same decode-size
/// inputs agree to the dtype's rounding.
fn fused_matches_unfused_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(93);
    for dtype in float_dtypes(client) {
        let (m, n, k) = (2, 70, 96);
        let (x, _) = upload(client, &input(&mut rng, m, k), &[m, k], dtype);
        let (g, _) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
        let (w, _) = upload(
            client,
            &random(&mut rng, 2 * n * k, 1.0),
            &[2 * n, k],
            dtype,
        );
        let norm = InputNorm {
            weight: &g,
            eps: EPS,
        };
        let run = |strategy: MatmulStrategy, gated: bool| {
            let normed = poisoned(client, &[m, k], dtype);
            let width = if gated { n } else { 2 * n };
            let out = poisoned(client, &[m, width], dtype);
            if gated {
                let gw = GatedWeights::Concatenated(&w);
                let act = Activation::Silu;
                fused_gated_mlp_normed_into_with(
                    client, &x, norm, &normed, gw, act, &out, strategy,
                )
                .unwrap();
            } else {
                linear_normed_into_with(client, &x, norm, &normed, &w, None, None, &out, strategy)
                    .unwrap();
            }
            out.to_f64_vec(client).unwrap()
        };
        for gated in [false, true] {
            let unfused = run(MatmulStrategy::Tiled, gated);
            for strategy in [MatmulStrategy::Gemv, MatmulStrategy::GemvSplit(4)] {
                let fused = run(strategy, gated);
                let what =
                    format!("{dtype} gated={gated} {strategy:?}: fused GEMV vs norm + tiled GEMM");
                assert_close(&what, &fused, &unfused, tolerance(dtype));
            }
        }
    }
}

/// The fused GEMV forced onto each K split (K not a multiple of the split, M = 1 and 16, N off
/// the cube's columns), plain with bias and residual and gated, against the f64 reference.
fn forced_split_normed_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(94);
    for dtype in float_dtypes(client) {
        for (m, n, k) in [(1usize, 37usize, 200usize), (16, 29, 130)] {
            let (x, xh) = upload(client, &input(&mut rng, m, k), &[m, k], dtype);
            let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
            let [(w, wh), (b, bh), (r, rh)] = linear_operands(client, &mut rng, (m, n, k), dtype);
            let norm = InputNorm {
                weight: &g,
                eps: EPS,
            };
            let h = normed_input(&xh, &gh, dtype, m);
            let plain_want = reference::linear(&h, &wh, Some(&bh), Some(&rh), (m, 2 * n, k));
            let (gate, up) = wh.split_at(n * k);
            let gated_want = reference::gated_mlp(&h, gate, up, false, (m, n, k));
            // (The unsplit GEMV takes these shapes in the cases above.)
            for strategy in [MatmulStrategy::GemvSplit(2), MatmulStrategy::GemvSplit(8)] {
                let normed = poisoned(client, &[m, k], dtype);
                let out = poisoned(client, &[m, 2 * n], dtype);
                let (bias, res) = (Some(&b), Some(&r));
                linear_normed_into_with(client, &x, norm, &normed, &w, bias, res, &out, strategy)
                    .unwrap();
                let what = format!("linear_normed {dtype} {m}x{}x{k} {strategy:?}", 2 * n);
                let got = out.to_f64_vec(client).unwrap();
                assert_close(&what, &got, &plain_want, tolerance(dtype));

                let out = poisoned(client, &[m, n], dtype);
                let gw = GatedWeights::Concatenated(&w);
                let act = Activation::Silu;
                fused_gated_mlp_normed_into_with(
                    client, &x, norm, &normed, gw, act, &out, strategy,
                )
                .unwrap();
                let what = format!("gated_normed {dtype} {m}x{n}x{k} {strategy:?}");
                let got = out.to_f64_vec(client).unwrap();
                assert_close(&what, &got, &gated_want, 2.0 * tolerance(dtype));
            }
        }
    }
}

fn normed_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let f = |shape: &[usize]| {
        let n = shape.iter().product();
        DeviceTensor::from_f32(client, &vec![0.5; n], shape, DType::F32).unwrap()
    };
    let (x, w, out, normed) = (f(&[3, 8]), f(&[5, 8]), f(&[3, 5]), f(&[3, 8]));
    let g = f(&[8]);
    let norm = |weight, eps| InputNorm { weight, eps };
    let run = |n: InputNorm<'_, R>, normed: &DeviceTensor<R>| {
        linear_normed_into(client, &x, n, normed, &w, None, None, &out)
    };
    assert!(run(norm(&g, EPS), &normed).is_ok());
    let short = f(&[7]);
    assert_err("norm weight", run(norm(&short, EPS), &normed), "shape");
    assert_err("eps", run(norm(&g, -1.0), &normed), "argument");
    assert_err("eps NaN", run(norm(&g, f32::NAN), &normed), "argument");
    let narrow = f(&[3, 7]);
    assert_err("normed shape", run(norm(&g, EPS), &narrow), "shape");
    let half = DeviceTensor::from_f32(client, &[0.5; 8], &[8], DType::F16).unwrap();
    assert_err("norm dtype", run(norm(&half, EPS), &normed), "dtype");
}

#[test]
fn linear_normed_matches_reference() {
    on_each_runtime!(linear_normed_case);
}

#[test]
fn gated_normed_matches_reference() {
    on_each_runtime!(gated_normed_case);
}

#[test]
fn fused_norm_matches_unfused() {
    on_each_runtime!(fused_matches_unfused_case);
}

#[test]
fn forced_split_normed_matches_reference() {
    on_each_runtime!(forced_split_normed_case);
}

#[test]
fn normed_errors() {
    on_each_runtime!(normed_errors_case);
}

/// With [`ProductOptions::rows_invariant`] (what continuous batching asks for), a GEMV row's
/// result does not depend on the other rows: each row of an M-row product (plain, with the input
/// norm, gated; without and with a split-K scratch, where K may be split across cubes) equals,
/// bit for bit, the same row computed alone. A request's text must not depend on what it is
/// batched with.
fn gemv_rows_independent_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(93);
    let cuda = ops::caps::runtime_name(client) == "cuda";
    // On CUDA a K of 4104 is more than one cube's planes cover: without a scratch they loop,
    // with one K is split across cubes.
    let (n, k) = if cuda { (1000, 4104) } else { (100, 200) };
    for dtype in float_dtypes(client) {
        for m in [2usize, 5, 16] {
            let (x, _) = upload(client, &input(&mut rng, m, k), &[m, k], dtype);
            let (w, _) = upload(client, &random(&mut rng, n * k, 0.5), &[n, k], dtype);
            let (gate_up, _) = upload(
                client,
                &random(&mut rng, 2 * n * k, 0.5),
                &[2 * n, k],
                dtype,
            );
            let (g, _) = upload(client, &random(&mut rng, k, 0.5), &[k], dtype);
            let norm = || InputNorm {
                weight: &g,
                eps: EPS,
            };
            let split = SplitScratch::new(
                client,
                ops::matmul::scratch_need(client, 2 * n, k)
                    .max(ops::matmul::scratch_need(client, n, k)),
            );
            let bits = |t: &DeviceTensor<R>| -> Vec<u64> {
                t.to_f64_vec(client)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            // The scratch only changes the tensor-core GEMV (CUDA): elsewhere one pass is enough.
            let scratches = if cuda {
                vec![None, Some(&split)]
            } else {
                vec![None]
            };
            for scratch in scratches {
                let opts = ProductOptions {
                    strategy: MatmulStrategy::Auto,
                    split_k: scratch,
                    rows_invariant: true,
                };
                // (what, the product of `rows` rows of x into `out`)
                type Run<'a, R> =
                    Box<dyn Fn(&DeviceTensor<R>, &DeviceTensor<R>, &DeviceTensor<R>) + 'a>;
                let runs: Vec<(&str, Run<'_, R>)> = vec![
                    (
                        "plain",
                        Box::new(|x, _normed, out| {
                            linear_opts_into(client, x, None, &w, None, None, out, opts).unwrap();
                        }),
                    ),
                    (
                        "normed",
                        Box::new(|x, normed, out| {
                            let norm = Some((norm(), normed));
                            linear_opts_into(client, x, norm, &w, None, None, out, opts).unwrap();
                        }),
                    ),
                    (
                        "gated",
                        Box::new(|x, normed, out| {
                            let weights = GatedWeights::Concatenated(&gate_up);
                            let norm = Some((norm(), normed));
                            fused_gated_mlp_opts_into(
                                client,
                                x,
                                norm,
                                weights,
                                Activation::Silu,
                                out,
                                opts,
                            )
                            .unwrap();
                        }),
                    ),
                ];
                for (what, run) in &runs {
                    let normed = DeviceTensor::empty(client, &[m, k], dtype);
                    let out = poisoned(client, &[m, n], dtype);
                    run(&x, &normed, &out);
                    let all = bits(&out);
                    for r in 0..m {
                        let row = DeviceTensor::from_f32(
                            client,
                            &row_values(client, &x, r, k),
                            &[1, k],
                            dtype,
                        )
                        .unwrap();
                        let normed1 = DeviceTensor::empty(client, &[1, k], dtype);
                        let out1 = poisoned(client, &[1, n], dtype);
                        run(&row, &normed1, &out1);
                        assert!(
                            bits(&out1) == all[r * n..(r + 1) * n],
                            "{dtype} {what} M={m} scratch={}: row {r} differs from the row alone",
                            scratch.is_some()
                        );
                    }
                }
            }
        }
    }
}

/// Row `r` of `x[M, K]` as f32 values (exact for every float dtype).
fn row_values<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    r: usize,
    k: usize,
) -> Vec<f32> {
    let all = x.to_f64_vec(client).unwrap();
    all[r * k..(r + 1) * k].iter().map(|&v| v as f32).collect()
}

#[test]
fn gemv_rows_do_not_depend_on_the_other_rows() {
    on_each_runtime!(gemv_rows_independent_case);
}
