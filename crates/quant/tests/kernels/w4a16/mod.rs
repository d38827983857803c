//! W4A16: the GEMV (M <= 16) and tiled kernels against the f64 reference of the same dequantized
//! arithmetic (`quant::reference::w4a16`), the quantization error against the float product
//! within the int4 bound, the layer and its fused input norm and epilogues; the tensor-core kernels
//! in `tensor_core`, every validation error in `errors`.

mod errors;
mod tensor_core;

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, NormedInput};
use ops::matmul::InputNorm;
use ops::{DType, DeviceTensor};
use quant::host::{self, Int4Weight};
use quant::reference as qref;
use quant::w4a16::{w4a16_linear, w4a16_linear_into_with};
use quant::{W4A16Linear, W4a16Kernel};

use crate::gated_reference;
use testkit::*;

/// Device operands of a quantized weight: qweight `[K/8, N]` i32 and scales `[N]` / `[K/g, N]`.
fn upload_weight<R: Runtime>(
    client: &ComputeClient<R>,
    w: &Int4Weight,
) -> (DeviceTensor<R>, DeviceTensor<R>) {
    let q = DeviceTensor::from_slice(client, &w.packed, &[w.k / 8, w.n]).unwrap();
    let shape = match w.group_size {
        None => vec![w.n],
        Some(g) => vec![w.k / g, w.n],
    };
    let s = DeviceTensor::from_slice(client, &w.scales, &shape).unwrap();
    (q, s)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    k: usize,
    n: usize,
    group: Option<usize>,
    bias: bool,
}

/// Runs one case with `kernel` into a NaN-poisoned output (and, for `Auto`, through the
/// allocating form too) and compares with the reference. `lead` reshapes x's rows (`[.., K]`).
fn check_case<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    c: Case,
    kernel: W4a16Kernel,
    lead: Option<&[usize]>,
    seed: u64,
) {
    let mut rng = rng(seed);
    let w = random(&mut rng, c.n * c.k, 1.0);
    let qw = host::quantize_weight_int4(&w, c.n, c.k, c.group).unwrap();
    let (q, s) = upload_weight(client, &qw);
    let mut x_shape = lead.map_or(vec![c.m], |l| l.to_vec());
    assert_eq!(x_shape.iter().product::<usize>(), c.m);
    x_shape.push(c.k);
    let (x, xr) = upload(client, &random(&mut rng, c.m * c.k, 1.0), &x_shape, dtype);
    let (b, br) = if c.bias {
        let (b, br) = upload(client, &random(&mut rng, c.n, 1.0), &[c.n], dtype);
        (Some(b), Some(br))
    } else {
        (None, None)
    };
    let want = qref::w4a16(&xr, c.m, &qw, br.as_deref());
    let mut out_shape = x_shape.clone();
    *out_shape.last_mut().unwrap() = c.n;
    let out = poisoned(client, &out_shape, dtype);
    w4a16_linear_into_with(client, &x, &q, &s, c.group, b.as_ref(), &out, kernel).unwrap();
    let what = format!("{c:?} {dtype} {kernel:?}");
    assert_close(
        &what,
        &out.to_f64_vec(client).unwrap(),
        &want,
        tolerance(dtype),
    );
    if kernel == W4a16Kernel::Auto {
        let y = w4a16_linear(client, &x, &q, &s, c.group, b.as_ref()).unwrap();
        assert_eq!(y.shape(), out_shape.as_slice(), "{what}: allocated shape");
        assert_eq!(y.dtype(), dtype);
        let y = y.to_f64_vec(client).unwrap();
        assert_close(&format!("{what} (allocating)"), &y, &want, tolerance(dtype));
    }
}

fn matches_reference_case<R: Runtime>(client: &ComputeClient<R>) {
    // K = 8 (one word), 136 (17 words, not a multiple of the tiled kernel's 16-wide K step),
    // 1024 (per channel and groups of 64 / 128); N around the 32-column cube width.
    let shapes = [
        (8usize, 33usize, None),
        (136, 127, None),
        (136, 1, Some(8)),
        (1024, 300, Some(128)),
        (1024, 33, Some(64)),
        (1024, 1, None),
    ];
    let mut seed = 0;
    for dtype in float_dtypes(client) {
        for m in [1usize, 3, 16, 17, 40] {
            for (i, &(k, n, group)) in shapes.iter().enumerate() {
                seed += 1;
                let c = Case {
                    m,
                    k,
                    n,
                    group,
                    bias: (i + m) % 2 == 0,
                };
                check_case(client, dtype, c, W4a16Kernel::Auto, None, seed);
            }
        }
    }
}

fn explicit_kernels_case<R: Runtime>(client: &ComputeClient<R>) {
    // The GEMV with several columns per unit (Auto picks them only for large N), and the tiled
    // kernel on decode-sized M, on shapes with partial cubes / tiles.
    let mut seed = 100;
    for dtype in float_dtypes(client) {
        for (m, k, n, group) in [
            (3usize, 136usize, 300usize, None),
            (1, 1024, 127, Some(128)),
        ] {
            for kernel in [
                W4a16Kernel::Gemv { cols_per_unit: 2 },
                W4a16Kernel::Gemv { cols_per_unit: 4 },
                W4a16Kernel::Tiled,
            ] {
                seed += 1;
                let c = Case {
                    m,
                    k,
                    n,
                    group,
                    bias: true,
                };
                check_case(client, dtype, c, kernel, None, seed);
            }
        }
        // A wide N, where Auto may give each GEMV unit several columns (K = 8 keeps it cheap).
        let wide = Case {
            m: 2,
            k: 8,
            n: 4500,
            group: None,
            bias: true,
        };
        check_case(client, dtype, wide, W4a16Kernel::Auto, None, 150);
        // x of rank 3: rows are all leading dimensions.
        let c = Case {
            m: 6,
            k: 64,
            n: 33,
            group: Some(64),
            bias: false,
        };
        check_case(client, dtype, c, W4a16Kernel::Auto, Some(&[2, 3]), 200);
        let c = Case { m: 18, ..c };
        check_case(client, dtype, c, W4a16Kernel::Auto, Some(&[3, 6]), 201);
    }
}

/// `|y - x·wᵀ| <= Σ_k |x[m, k]| · s(k, n) / 2`: symmetric int4 with `s = amax / 7` never clamps,
/// so each weight is off by at most half a step. Checked through the layer, with an all-zero
/// output channel, an all-zero row of x and a large weight outlier.
fn error_bound_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(300);
    for dtype in float_dtypes(client) {
        for (m, k, n, group) in [(4usize, 256usize, 40usize, None), (20, 256, 40, Some(64))] {
            let mut w = random(&mut rng, n * k, 1.0);
            w[..k].fill(0.0);
            w[2 * k + 5] = 50.0;
            let mut xv = random(&mut rng, m * k, 1.0);
            xv[k..2 * k].fill(0.0);
            let bias = random(&mut rng, n, 1.0);
            let layer = W4A16Linear::from_dense(client, &w, [n, k], dtype, group).unwrap();
            let (x, xr) = upload(client, &xv, &[m, k], dtype);
            let (b, _) = upload(client, &bias, &[n], dtype);
            let got = layer
                .forward(client, &x, Epilogue::NONE.bias(Some(&b)))
                .unwrap()
                .to_f64_vec(client)
                .unwrap();
            let qw = host::quantize_weight_int4(&w, n, k, group).unwrap();
            let w64: Vec<f64> = w.iter().map(|&v| v as f64).collect();
            let br = round_to(&bias, dtype);
            let exact = qref::linear(&xr, &w64, Some(&br), m, n, k);
            let rms = (exact.iter().map(|v| v * v).sum::<f64>() / exact.len() as f64).sqrt();
            // Rounding errors are at most uniform on [-s/2, s/2] and independent across k, so
            // the mean square error is at most the mean of Σ_k x² s² / 12 (a tighter, statistical
            // check than the worst case; 1.5x covers the sampling noise of m·n elements). The
            // zero and outlier channels (0 and 2) are left out: their errors are far below it
            // and would hide the others.
            let (mut sq_err, mut sq_expected) = (0f64, 0f64);
            for i in 0..m {
                for j in 3..n {
                    sq_err += (got[i * n + j] - exact[i * n + j]).powi(2);
                    sq_expected += (0..k)
                        .map(|t| (xr[i * k + t] * qw.scale(t, j) as f64).powi(2) / 12.0)
                        .sum::<f64>();
                }
            }
            let (rms_err, rms_expected) = (sq_err.sqrt(), sq_expected.sqrt());
            assert!(
                rms_err <= 1.5 * rms_expected,
                "{dtype} group {group:?}: rms error {rms_err:.4e} > 1.5 x {rms_expected:.4e}"
            );
            for i in 0..m {
                for j in 0..n {
                    let bound: f64 = (0..k)
                        .map(|t| xr[i * k + t].abs() * qw.scale(t, j) as f64 / 2.0)
                        .sum();
                    let e = exact[i * n + j];
                    // Plus the kernel's own rounding (the output dtype).
                    let slack = tolerance(dtype) * (e.abs() + rms);
                    let err = (got[i * n + j] - e).abs();
                    assert!(
                        err <= bound + slack,
                        "{dtype} group {group:?} [{i}, {j}]: error {err:.4e} > bound {bound:.4e}"
                    );
                    if i == 1 {
                        // Zero row of x: exactly the bias (rounded to the dtype).
                        assert!(err <= slack, "zero row [{i}, {j}]: {err:.3e}");
                    }
                }
            }
        }
    }
}

fn layer_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(400);
    for dtype in float_dtypes(client) {
        // The layer's own layout and kernels: the column-major GEMV for M <= 16 (K/8 odd: one
        // word per load; group 8: a scale per word), the tiled kernel above.
        for (m, k, n, group, with_bias) in [
            (5usize, 256usize, 70usize, None, true),
            (5, 256, 70, Some(128), false),
            (1, 264, 33, Some(8), true),
            (16, 1536, 9, Some(64), false),
            (17, 256, 70, Some(128), true),
            (40, 136, 65, None, false),
        ] {
            let w = random(&mut rng, n * k, 0.5);
            let bias = random(&mut rng, n, 1.0);
            let (b, _) = upload(client, &bias, &[n], dtype);
            let epilogue = Epilogue::NONE.bias(with_bias.then_some(&b));
            let layer = W4A16Linear::from_dense(client, &w, [n, k], dtype, group).unwrap();
            assert_eq!(layer.in_features(), k);
            assert_eq!(layer.out_rows(), n);
            let scales = group.map_or(n, |g| k / g * n);
            assert_eq!(layer.weight_bytes(), 4 * (k / 8 * n) + 4 * scales);
            let qw = host::quantize_weight_int4(&w, n, k, group).unwrap();
            let (x, xr) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let br = round_to(&bias, dtype);
            let want = qref::w4a16(&xr, m, &qw, with_bias.then_some(&br[..]));
            let out = poisoned(client, &[m, n], dtype);
            layer
                .forward_into(client, &x, epilogue, &out, None)
                .unwrap();
            let what = format!("layer {dtype} {m}x{k}x{n} group {group:?}");
            assert_close(
                &what,
                &out.to_f64_vec(client).unwrap(),
                &want,
                tolerance(dtype),
            );
            let y = layer.forward(client, &x, epilogue).unwrap();
            assert_close(
                &what,
                &y.to_f64_vec(client).unwrap(),
                &want,
                tolerance(dtype),
            );
        }
    }
}

/// The layer's residual and gated epilogues: fused into the GEMV up to 16 rows, element-wise
/// kernels above, both against the f64 reference of the same quantized product.
fn layer_epilogues_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(401);
    for dtype in float_dtypes(client) {
        // K/8 odd (one word per load), group 8 (a scale per word), K past one batch of loads;
        // K = 16384: a lane's vectors take several passes of loads (2 plain, 3 gated).
        for (m, k, n, group) in [
            (1usize, 264usize, 34usize, Some(8)),
            (3, 256, 70, Some(128)),
            (16, 1536, 18, Some(128)),
            (1, 2048, 130, None),
            (17, 256, 70, Some(128)),
            (1, 16384, 6, Some(128)),
        ] {
            let w = random(&mut rng, n * k, 0.5);
            let layer = W4A16Linear::from_dense(client, &w, [n, k], dtype, group).unwrap();
            let qw = host::quantize_weight_int4(&w, n, k, group).unwrap();
            let (x, xr) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let product = qref::w4a16(&xr, m, &qw, None);
            let what = format!("layer epilogue {dtype} {m}x{k}x{n} group {group:?}");

            let (r, rr) = upload(client, &random(&mut rng, m * n, 1.0), &[m, n], dtype);
            let out = poisoned(client, &[m, n], dtype);
            let epilogue = Epilogue::NONE.residual(&r);
            layer
                .forward_into(client, &x, epilogue, &out, None)
                .unwrap();
            let want: Vec<f64> = product.iter().zip(&rr).map(|(p, r)| p + r).collect();
            let got = out.to_f64_vec(client).unwrap();
            assert_close(&format!("{what} residual"), &got, &want, tolerance(dtype));

            // Gated: the first n/2 rows are the gate, the rest the up rows.
            check_gated(client, &layer, &x, &product, &what);
        }
    }
}

/// The input RMSNorm applied by the GEMV (x staged in shared memory where it fits, read per
/// column where not), plain and gated, against the f64 norm rounded to the dtype followed by the
/// reference product; and a row's output not depending on the rows beside it: one row alone
/// equals the same row among 4 rows of K = 2816 (on the CUDA-core GEMV, x staged against x read
/// per column, too many bytes to stage; on the tensor cores, one against four MMA columns).
fn normed_case<R: Runtime>(client: &ComputeClient<R>) {
    const EPS: f32 = 1e-6;
    let mut rng = rng(402);
    for dtype in float_dtypes(client) {
        // K/8 odd (one word per load), group 8, gated cases, rows of different scales, and the
        // 16 rows of a batched decode step (plain and gated).
        for (m, k, n, group, gated) in [
            (1usize, 96usize, 33usize, Some(32), false),
            (3, 264, 40, Some(8), false),
            (2, 256, 34, Some(128), true),
            (4, 2816, 18, Some(128), false),
            (16, 264, 37, Some(8), false),
            (16, 256, 34, Some(128), true),
        ] {
            let x = rows_of_rising_scale(&mut rng, m, k);
            let (xt, xh) = upload(client, &x, &[m, k], dtype);
            let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
            let w = random(&mut rng, n * k, 0.5);
            let layer = W4A16Linear::from_dense(client, &w, [n, k], dtype, group).unwrap();
            let qw = host::quantize_weight_int4(&w, n, k, group).unwrap();
            let normed = poisoned(client, &[m, k], dtype);
            let input = NormedInput {
                x: &xt,
                norm: InputNorm {
                    weight: &g,
                    eps: EPS,
                },
                normed: &normed,
            };
            // The kernels round the normalised row as `ops::norm` does, `F(F(x · rstd) · g)`;
            // against one rounding of the f64 norm the f16 errors reach 1.2e-3 (more than
            // f16's tolerance), against the same two roundings at most 7.2e-4.
            let h = rms_norm_rounded(&xh, &gh, EPS, dtype);
            let product = qref::w4a16(&h, m, &qw, None);
            let what = format!("normed {dtype} {m}x{k}x{n} group {group:?} gated {gated}");
            let (out, want, tol) = if gated {
                let i = n / 2;
                let out = poisoned(client, &[m, i], dtype);
                let epilogue = Epilogue::NONE.gated(ops::matmul::Activation::Silu);
                layer
                    .forward_normed_into(client, input, epilogue, &out, None)
                    .unwrap();
                let want = gated_reference(&product, m, n);
                (out, want, 2.0 * tolerance(dtype))
            } else {
                let out = poisoned(client, &[m, n], dtype);
                layer
                    .forward_normed_into(client, input, Epilogue::NONE, &out, None)
                    .unwrap();
                (out, product, tolerance(dtype))
            };
            let got = out.to_f64_vec(client).unwrap();
            assert_close(&what, &got, &want, tol);

            if k == 2816 {
                let r = 2;
                let (x1, _) = upload(client, &x[r * k..(r + 1) * k], &[1, k], dtype);
                let normed1 = poisoned(client, &[1, k], dtype);
                let input = NormedInput {
                    x: &x1,
                    norm: InputNorm {
                        weight: &g,
                        eps: EPS,
                    },
                    normed: &normed1,
                };
                let out1 = poisoned(client, &[1, n], dtype);
                layer
                    .forward_normed_into(client, input, Epilogue::NONE, &out1, None)
                    .unwrap();
                let one = out1.to_f64_vec(client).unwrap();
                assert_eq!(
                    one[..],
                    got[r * n..(r + 1) * n],
                    "{what}: row {r} alone (x staged) differs from the same row among 4 (x read per column)"
                );
            }
        }
    }
}

/// The RMSNorm of the rows of `x` as the tensor-core GEMV applies it in bf16: `F(x · g)` staged
/// (one rounding), and `rstd` (f64 here) multiplying the product, which by linearity equals
/// `F(x · g) · rstd` as the input.
fn norm_staged(x: &[f64], g: &[f64], k: usize, eps: f32, dtype: DType) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(k) {
        let rstd = ops::reference::norm::inv_rms(row, eps as f64);
        let weighted: Vec<f32> = row.iter().zip(g).map(|(v, w)| (v * w) as f32).collect();
        out.extend(round_to(&weighted, dtype).into_iter().map(|v| v * rstd));
    }
    out
}

/// `layer` on `x` with the gated SiLU epilogue into a poisoned output, against
/// [`gated_reference`] of `product` (the f64 reference of the bare product, `[m, n]`).
fn check_gated<R: Runtime>(
    client: &ComputeClient<R>,
    layer: &W4A16Linear<R>,
    x: &DeviceTensor<R>,
    product: &[f64],
    what: &str,
) {
    let dtype = x.dtype();
    let n = layer.out_rows();
    let m = product.len() / n;
    let out = poisoned(client, &[m, n / 2], dtype);
    let gated = Epilogue::NONE.gated(ops::matmul::Activation::Silu);
    layer.forward_into(client, x, gated, &out, None).unwrap();
    let want = gated_reference(product, m, n);
    let got = out.to_f64_vec(client).unwrap();
    // Gate and up are rounded to the dtype before the activation (two roundings the f64
    // reference does not make).
    assert_close(
        &format!("{what} gated"),
        &got,
        &want,
        2.0 * tolerance(dtype),
    );
}

/// `layer` on `x` with `bias` and `residual` (host values, uploaded in x's dtype) into a
/// poisoned output, against `product` (the f64 reference of the bare product, `[m, n]`) plus
/// both.
fn check_bias_residual<R: Runtime>(
    client: &ComputeClient<R>,
    layer: &W4A16Linear<R>,
    x: &DeviceTensor<R>,
    product: &[f64],
    bias: &[f32],
    residual: &[f32],
    what: &str,
) {
    let dtype = x.dtype();
    let n = bias.len();
    let m = product.len() / n;
    let (b, _) = upload(client, bias, &[n], dtype);
    let (r, rr) = upload(client, residual, &[m, n], dtype);
    let br = round_to(bias, dtype);
    let out = poisoned(client, &[m, n], dtype);
    let epilogue = Epilogue::NONE.bias(Some(&b)).residual(&r);
    layer.forward_into(client, x, epilogue, &out, None).unwrap();
    let want: Vec<f64> = (0..m * n).map(|e| product[e] + br[e % n] + rr[e]).collect();
    let got = out.to_f64_vec(client).unwrap();
    assert_close(
        &format!("{what} bias+residual"),
        &got,
        &want,
        tolerance(dtype),
    );
}

#[test]
fn matches_reference() {
    on_each_runtime!(matches_reference_case);
}

#[test]
fn explicit_kernels_and_rank3() {
    on_each_runtime!(explicit_kernels_case);
}

#[test]
fn error_within_int4_bound() {
    on_each_runtime!(error_bound_case);
}

#[test]
fn layer() {
    on_each_runtime!(layer_case);
}

#[test]
fn layer_epilogues() {
    on_each_runtime!(layer_epilogues_case);
}

#[test]
fn input_norm_matches_reference() {
    on_each_runtime!(normed_case);
}
