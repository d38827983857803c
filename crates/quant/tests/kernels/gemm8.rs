//! The 8-bit GEMM (int8 and fp8 e4m3), W8A8 / FP8 linear layers and `fp8_gemm`: against f64
//! references of the same quantized arithmetic (exact where the integer accumulation is
//! observable), and against the float product within the bound the format implies.

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, LinearWorkspace};
use ops::{DType, DeviceTensor};
use quant::format::QuantFormat;
use quant::host::{quantize_weight_8bit, ByteMatrix};
use quant::reference as qref;
use quant::{fp8_gemm, gemm8_into, w8a8_linear, Fp8Linear, KernelChoice, W8A8Linear};
use testkit::*;

/// The 8-bit layer of `fmt` for a host weight `[n, k]`.
fn layer8<R: Runtime>(
    client: &ComputeClient<R>,
    fmt: QuantFormat,
    w: &[f32],
    [n, k]: [usize; 2],
    dtype: DType,
) -> Box<dyn Linear<R>> {
    match fmt {
        QuantFormat::Int8 => Box::new(W8A8Linear::from_dense(client, w, [n, k], dtype).unwrap()),
        QuantFormat::Fp8E4M3 => Box::new(Fp8Linear::from_dense(client, w, [n, k], dtype).unwrap()),
    }
}

const FORMATS: [QuantFormat; 2] = [QuantFormat::Int8, QuantFormat::Fp8E4M3];

/// Random rows with a zero row and a large outlier (the awkward cases of per-row scales).
fn rows_with_outliers(rng: &mut rand::rngs::StdRng, m: usize, k: usize) -> Vec<f32> {
    let mut x = random(rng, m * k, 2.0);
    if m > 1 {
        x[k..2 * k].fill(0.0);
    }
    if m > 2 {
        x[2 * k + k / 2] = 300.0;
    }
    x
}

/// [`assert_close`] row by row: an outlier row must not widen the tolerance of the others.
fn assert_rows_close(what: &str, got: &[f64], want: &[f64], n: usize, tol: f64) {
    for (r, (g, w)) in got.chunks(n).zip(want.chunks(n)).enumerate() {
        assert_close(&format!("{what} row {r}"), g, w, tol);
    }
}

/// Relative tolerance of a dequantized output in `dtype` (the accumulation is exact for int8
/// and exact products summed in f32 for fp8).
/// A relative 1e-3 holds for f32 and f16 outputs; a bf16 output alone rounds by up to 2^-8
/// relative (7 stored mantissa bits), so there the bound is that rounding.
fn dequant_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::BF16 => 4e-3,
        _ => 1e-3,
    }
}

/// Random 8-bit GEMM operands (A with a zero row and an outlier), quantized on the device and
/// on the host, and the host's exact accumulators.
struct Operands8<R: Runtime> {
    qa: DeviceTensor<R>,
    sa: DeviceTensor<R>,
    qb: DeviceTensor<R>,
    sb: DeviceTensor<R>,
    sah: Vec<f32>,
    sbh: Vec<f32>,
    acc: Vec<f64>,
}

fn operands8<R: Runtime>(
    client: &ComputeClient<R>,
    rng: &mut rand::rngs::StdRng,
    [m, n, k]: [usize; 3],
    fmt: QuantFormat,
) -> Operands8<R> {
    let a = rows_with_outliers(rng, m, k);
    let b = random(rng, n * k, 1.0);
    let (at, ah) = upload(client, &a, &[m, k], DType::F32);
    let (bt, bh) = upload(client, &b, &[n, k], DType::F32);
    let (qa, sa) = quant::quantize_per_row(client, &at, fmt).unwrap();
    let (qb, sb) = quant::quantize_per_row(client, &bt, fmt).unwrap();
    let (ca, sah) = qref::quantize_rows(&ah, m, k, fmt);
    let (cb, sbh) = qref::quantize_rows(&bh, n, k, fmt);
    let acc = qref::gemm_nt_codes(&ca, &cb, m, n, k, fmt);
    Operands8 {
        qa,
        sa,
        qb,
        sb,
        sah,
        sbh,
        acc,
    }
}

fn gemm8_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(81);
    for fmt in FORMATS {
        for (m, n, k) in [
            (1, 1, 1),
            (1, 33, 127),
            (3, 100, 33),
            (17, 33, 256),
            (64, 65, 100),
            (70, 130, 40),
        ] {
            let Operands8 {
                qa,
                sa,
                qb,
                sb,
                sah,
                sbh,
                acc,
            } = operands8(client, &mut rng, [m, n, k], fmt);
            for dtype in float_dtypes(client) {
                for with_bias in [false, true] {
                    let what = format!("gemm8 {fmt:?} {dtype} {m}x{n}x{k} bias {with_bias}");
                    let (bias, biash) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
                    let out = poisoned(client, &[m, n], dtype);
                    let bias_arg = with_bias.then_some(&bias);
                    gemm8_into(
                        client,
                        &qa,
                        &sa,
                        &qb,
                        &sb,
                        bias_arg,
                        &out,
                        KernelChoice::default(),
                    )
                    .unwrap();
                    let want = qref::dequant_epilogue(
                        &acc,
                        m,
                        n,
                        &sah,
                        &sbh,
                        with_bias.then_some(biash.as_slice()),
                    );
                    let got = out.to_f64_vec(client).unwrap();
                    assert_rows_close(&what, &got, &want, n, dequant_tolerance(dtype));
                }
            }
            // Unit scales in f32: the accumulator itself, exact for int8 (|acc| < 2^24).
            if fmt == QuantFormat::Int8 {
                let one = DeviceTensor::from_f32(client, &[1.0], &[1], DType::F32).unwrap();
                let out = poisoned(client, &[m, n], DType::F32);
                gemm8_into(
                    client,
                    &qa,
                    &one,
                    &qb,
                    &one,
                    None,
                    &out,
                    KernelChoice::Portable,
                )
                .unwrap();
                assert_exact(
                    &format!("int8 accumulators {m}x{n}x{k}"),
                    &out.to_f64_vec(client).unwrap(),
                    &acc,
                );
            }
        }
    }
}

/// Both kernel choices (on CUDA, `Auto` is the skinny tensor-core kernel for M <= 16 and the
/// tile one above; elsewhere both are the portable kernel) on shapes that cross the 128x128
/// tiles, the 16-row limit, the 64-byte K chunks and the K splits of both tensor-core kernels:
/// int8 accumulators exact, fp8 within the f32-summation tolerance, and the scaled epilogue with
/// a bias.
fn gemm8_kernel_choices_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(82);
    for fmt in FORMATS {
        for (m, n, k) in [
            (1, 8, 32),
            (1, 300, 8960),
            // Long K over few tiles: more chunks per warp than one batch of loads holds, so
            // the K slice takes several passes with a short last one.
            (2, 64, 12800),
            (5, 200, 96),
            (9, 17, 1100),
            (16, 77, 1000),
            // 16 rows of codes past the skinny kernel's 16 KB stage: read from global memory.
            (16, 40, 1300),
            (17, 64, 64),
            (130, 257, 200),
            (256, 128, 64),
            (129, 300, 1000),
            // Few tiles over a long K: on CUDA the tile kernel splits K (8 slices of 16 steps,
            // the last short; 2 slices of 10), the slices summed by a second launch.
            (40, 200, 4000),
            (72, 1000, 640),
            // Wide N: several 8-column tiles per cube, fewer (down to one) warps per tile.
            (1, 9000, 64),
            (3, 40000, 32),
        ] {
            let Operands8 {
                qa,
                sa,
                qb,
                sb,
                sah,
                sbh,
                acc,
            } = operands8(client, &mut rng, [m, n, k], fmt);
            let (bias, biash) = upload(client, &random(&mut rng, n, 1.0), &[n], DType::F32);
            for choice in [KernelChoice::Portable, KernelChoice::Auto] {
                let what = format!("gemm8 {choice:?} {fmt:?} {m}x{n}x{k}");
                let one = DeviceTensor::from_f32(client, &[1.0], &[1], DType::F32).unwrap();
                let out = poisoned(client, &[m, n], DType::F32);
                gemm8_into(client, &qa, &one, &qb, &one, None, &out, choice).unwrap();
                let got = out.to_f64_vec(client).unwrap();
                if fmt == QuantFormat::Int8 {
                    assert_exact(&format!("{what} accumulators"), &got, &acc);
                } else {
                    assert_rows_close(&what, &got, &acc, n, dequant_tolerance(DType::F32));
                }
                let out = poisoned(client, &[m, n], DType::F32);
                gemm8_into(client, &qa, &sa, &qb, &sb, Some(&bias), &out, choice).unwrap();
                let want = qref::dequant_epilogue(&acc, m, n, &sah, &sbh, Some(biash.as_slice()));
                assert_rows_close(
                    &format!("{what} bias"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    n,
                    dequant_tolerance(DType::F32),
                );
            }
        }
    }
}

/// The largest error of a code times its scale for a value `v` of a row with scale `s`.
fn code_error(fmt: QuantFormat, v: f64, s: f64) -> f64 {
    match fmt {
        QuantFormat::Int8 => s / 2.0,
        // 3 mantissa bits: half an ulp is 1/16 of the value; subnormals step by 2^-9 s.
        QuantFormat::Fp8E4M3 => v.abs() / 16.0 + s * 2f64.powi(-10),
    }
}

/// `|y - x·wᵀ| <= Σ_k |x| Δw + |w| Δx + Δx Δw` (+ output rounding): the format's bound.
#[allow(clippy::too_many_arguments)]
fn assert_within_format_bound(
    what: &str,
    got: &[f64],
    x: &[f64],
    w: &[f64],
    m: usize,
    n: usize,
    k: usize,
    fmt: QuantFormat,
    dtype: DType,
) {
    let exact = qref::linear(x, w, None, m, n, k);
    let (_, sx) = qref::quantize_rows(x, m, k, fmt);
    let (_, sw) = qref::quantize_rows(w, n, k, fmt);
    for i in 0..m {
        for j in 0..n {
            let mut bound = 0.0;
            for t in 0..k {
                let (xv, wv) = (x[i * k + t], w[j * k + t]);
                let dx = code_error(fmt, xv, sx[i] as f64);
                let dw = code_error(fmt, wv, sw[j] as f64);
                bound += xv.abs() * dw + wv.abs() * dx + dx * dw;
            }
            let y = exact[i * n + j];
            bound += y.abs() * tolerance(dtype).max(1e-6) * 2.0 + 1e-6;
            let err = (got[i * n + j] - y).abs();
            assert!(
                err <= bound,
                "{what}: [{i}, {j}] got {} want {y} (error {err:.3e} > bound {bound:.3e})",
                got[i * n + j]
            );
        }
    }
}

fn linear8_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(82);
    for fmt in FORMATS {
        for dtype in float_dtypes(client) {
            // On CUDA: short rows at M <= 16 are quantized inside the skinny GEMM (1x33x127,
            // 3x100x64, 16x24x1000); the rows of 8960 are longer than it quantizes itself, so
            // they take the pre-pass and the skinny GEMM stages its codes (1x65x8960, 2x40x8960);
            // M = 17 takes the pre-pass and the tile GEMM.
            for (m, n, k) in [
                (1, 33, 127),
                (3, 100, 64),
                (1, 65, 8960),
                (16, 24, 1000),
                (2, 40, 8960),
                (1, 9000, 64),
                (17, 40, 300),
            ] {
                let x = rows_with_outliers(&mut rng, m, k);
                let w = random(&mut rng, n * k, 0.5);
                let bias = random(&mut rng, n, 1.0);
                let (xt, xh) = upload(client, &x, &[m, k], dtype);
                let (bt, biash) = upload(client, &bias, &[n], dtype);
                let what = format!("{fmt:?} linear {dtype} {m}x{n}x{k}");
                let l = layer8(client, fmt, &w, [n, k], dtype);
                assert_eq!((l.in_features(), l.out_rows()), (k, n));
                let got = l
                    .forward(client, &xt, Epilogue::NONE.bias(Some(&bt)))
                    .unwrap();
                assert_eq!(got.shape(), &[m, n]);
                let got = got.to_f64_vec(client).unwrap();
                // The same quantized arithmetic on the host.
                let qw = quantize_weight_8bit(&w, n, k, fmt).unwrap();
                let (cx, sx) = qref::quantize_rows(&xh, m, k, fmt);
                let acc = qref::gemm_nt_codes(&cx, &qw.q.dense(), m, n, k, fmt);
                let want = qref::dequant_epilogue(&acc, m, n, &sx, &qw.scales, Some(&biash));
                assert_rows_close(&what, &got, &want, n, dequant_tolerance(dtype));
                // And the float product within the format's bound (bias removed).
                let no_bias: Vec<f64> = got
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v - biash[i % n])
                    .collect();
                let wh: Vec<f64> = w.iter().map(|&v| v as f64).collect();
                assert_within_format_bound(&what, &no_bias, &xh, &wh, m, n, k, fmt, dtype);
            }
        }
    }
}

/// `forward_into` through a preallocated workspace larger than the input, on a 3-d input, equals
/// `forward`; and the free function gives the layer's answer.
fn linear8_into_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(83);
    let (n, k) = (48, 72);
    let w = random(&mut rng, n * k, 0.5);
    let x = random(&mut rng, 2 * 3 * k, 1.0);
    let (xt, _) = upload(client, &x, &[2, 3, k], DType::F32);
    let l = W8A8Linear::from_dense(client, &w, [n, k], DType::F32).unwrap();
    let want = l.forward(client, &xt, Epilogue::NONE).unwrap();
    let want = want.to_f64_vec(client).unwrap();
    let ws = LinearWorkspace::new(client, 16, 100, 64, DType::F32);
    let out = poisoned(client, &[2, 3, n], DType::F32);
    l.forward_into(client, &xt, Epilogue::NONE, &out, Some(&ws))
        .unwrap();
    assert_exact("into", &out.to_f64_vec(client).unwrap(), &want);
    let qw = quantize_weight_8bit(&w, n, k, QuantFormat::Int8).unwrap();
    let q = qw.q.upload(client, DType::I8);
    let s = DeviceTensor::from_f32(client, &qw.scales, &[n], DType::F32).unwrap();
    let free = w8a8_linear(client, &xt, &q, &s, None).unwrap();
    assert_exact("free fn", &free.to_f64_vec(client).unwrap(), &want);
    assert!(l.weight_bytes() >= n * k + 4 * n);
}

/// The residual added in the GEMM epilogue equals the product plus the residual, for both
/// formats, every float dtype, the fused decode paths (M = 1 and 16) and the pre-pass paths
/// (M = 5 and M = 20 on CUDA); a residual of the wrong shape or dtype is refused.
fn linear8_residual_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(85);
    let (n, k) = (40, 96);
    let w = random(&mut rng, n * k, 0.5);
    for fmt in FORMATS {
        for dtype in float_dtypes(client) {
            for m in [1usize, 5, 16, 20] {
                let (xt, _) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
                let (rt, rh) = upload(client, &random(&mut rng, m * n, 2.0), &[m, n], dtype);
                let (plain, with_residual) = (
                    poisoned(client, &[m, n], dtype),
                    poisoned(client, &[m, n], dtype),
                );
                let l = layer8(client, fmt, &w, [n, k], dtype);
                let ws = LinearWorkspace::new(client, m, k, n, dtype);
                let run = |residual: Option<&DeviceTensor<R>>, out: &DeviceTensor<R>| {
                    let e = Epilogue {
                        residual,
                        ..Epilogue::NONE
                    };
                    l.forward_into(client, &xt, e, out, Some(&ws))
                };
                run(None, &plain).unwrap();
                run(Some(&rt), &with_residual).unwrap();
                let want: Vec<f64> = plain
                    .to_f64_vec(client)
                    .unwrap()
                    .iter()
                    .zip(&rh)
                    .map(|(p, r)| p + r)
                    .collect();
                let what = format!("{fmt:?} residual {dtype} m {m}");
                let got = with_residual.to_f64_vec(client).unwrap();
                assert_rows_close(&what, &got, &want, n, 2.0 * tolerance(dtype));
                let wrong = poisoned(client, &[m, n + 1], dtype);
                assert!(run(Some(&wrong), &plain).is_err(), "{what}: wrong shape");
            }
        }
    }
}

fn fp8_gemm_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(84);
    let fmt = QuantFormat::Fp8E4M3;
    for (m, k, n) in [(1, 1, 1), (3, 33, 17), (20, 100, 70)] {
        let a = rows_with_outliers(&mut rng, m, k);
        let b = random(&mut rng, k * n, 1.0);
        let (at, ah) = upload(client, &a, &[m, k], DType::F32);
        let (bt, bh) = upload(client, &b, &[k, n], DType::F32);
        let (ca, sa) = qref::quantize_rows(&ah, m, k, fmt);
        let (cb, sb) = qref::quantize_cols(&bh, k, n, fmt);
        let want = qref::dequant_epilogue(
            &qref::gemm_nt_codes(&ca, &cb, m, n, k, fmt),
            m,
            n,
            &sa,
            &sb,
            None,
        );
        for out_dtype in float_dtypes(client) {
            let what = format!("fp8_gemm {m}x{k}x{n} -> {out_dtype}");
            let got = fp8_gemm(client, &at, &bt, None, None, out_dtype).unwrap();
            assert_eq!(got.shape(), &[m, n]);
            assert_rows_close(
                &what,
                &got.to_f64_vec(client).unwrap(),
                &want,
                n,
                dequant_tolerance(out_dtype),
            );
        }
        // Pre-quantized operands with their scales: the same codes, the same answer.
        let (qa, sat) = quant::quantize_per_row(client, &at, fmt).unwrap();
        let b_codes: Vec<u8> = (0..k)
            .flat_map(|t| (0..n).map(move |j| (t, j)))
            .map(|(t, j)| cb[j * k + t])
            .collect();
        let qb = ByteMatrix::from_dense(k, n, &b_codes)
            .unwrap()
            .upload(client, DType::F8E4M3);
        let sbt = DeviceTensor::from_f32(client, &sb, &[n], DType::F32).unwrap();
        let got = fp8_gemm(client, &qa, &qb, Some(&sat), Some(&sbt), DType::F32).unwrap();
        assert_rows_close(
            &format!("fp8_gemm pre-quantized {m}x{k}x{n}"),
            &got.to_f64_vec(client).unwrap(),
            &want,
            n,
            dequant_tolerance(DType::F32),
        );
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let f =
        |v: &[f32], shape: &[usize]| DeviceTensor::from_f32(client, v, shape, DType::F32).unwrap();
    let x = f(&[1.0; 12], &[3, 4]);
    let w = [0.5f32; 20];
    let l = W8A8Linear::from_dense(client, &w, [5, 4], DType::F32).unwrap();
    let none = Epilogue::NONE;
    // Shapes.
    assert_err(
        "k mismatch",
        l.forward(client, &f(&[1.0; 15], &[3, 5]), none),
        "shape",
    );
    let small = LinearWorkspace::new(client, 2, 4, 5, DType::F32);
    let out = poisoned(client, &[3, 5], DType::F32);
    assert_err(
        "small workspace",
        l.forward_into(client, &x, none, &out, Some(&small)),
        "shape",
    );
    let big = LinearWorkspace::new(client, 8, 4, 5, DType::F32);
    let bad_out = poisoned(client, &[3, 4], DType::F32);
    assert_err(
        "out shape",
        l.forward_into(client, &x, none, &bad_out, Some(&big)),
        "shape",
    );
    let short_bias = f(&[1.0; 4], &[4]);
    assert_err(
        "bias length",
        l.forward_into(client, &x, none.bias(Some(&short_bias)), &out, Some(&big)),
        "shape",
    );
    assert_err(
        "weight values",
        W8A8Linear::<R>::from_dense(client, &w[..19], [5, 4], DType::F32),
        "shape",
    );
    assert_err(
        "non-finite weight",
        Fp8Linear::<R>::from_dense(client, &[f32::NAN; 20], [5, 4], DType::F32),
        "argument",
    );
    // Dtypes.
    let (q, s) = quant::quantize_per_row(client, &x, QuantFormat::Int8).unwrap();
    let (q8, s8) = quant::quantize_per_row(client, &x, QuantFormat::Fp8E4M3).unwrap();
    let o = poisoned(client, &[3, 3], DType::F32);
    let run =
        |a: &DeviceTensor<R>, sa: &DeviceTensor<R>, b: &DeviceTensor<R>, sb: &DeviceTensor<R>| {
            gemm8_into(client, a, sa, b, sb, None, &o, KernelChoice::default())
        };
    assert_err("mixed formats", run(&q, &s, &q8, &s8), "dtype");
    assert_err("float operand", run(&x, &s, &q, &s), "dtype");
    assert_err(
        "scale length",
        run(&q, &f(&[1.0; 2], &[2]), &q, &s),
        "shape",
    );
    assert_err(
        "out shape",
        gemm8_into(
            client,
            &q,
            &s,
            &q,
            &s,
            None,
            &poisoned(client, &[3, 4], DType::F32),
            KernelChoice::default(),
        ),
        "shape",
    );
    assert_err(
        "w8a8 with fp8 weight",
        w8a8_linear(client, &x, &q8, &s8, None),
        "argument",
    );
    // fp8_gemm's contract.
    let b = f(&[1.0; 8], &[4, 2]);
    let sb = f(&[1.0; 2], &[2]);
    assert_err(
        "scale for float a",
        fp8_gemm(client, &x, &b, Some(&s), None, DType::F32),
        "argument",
    );
    assert_err(
        "scale for float b",
        fp8_gemm(client, &x, &b, None, Some(&sb), DType::F32),
        "argument",
    );
    assert_err(
        "missing a_scale",
        fp8_gemm(client, &q8, &b, None, None, DType::F32),
        "argument",
    );
    assert_err(
        "inner dims",
        fp8_gemm(client, &x, &f(&[1.0; 6], &[3, 2]), None, None, DType::F32),
        "shape",
    );
    assert_err(
        "int out",
        fp8_gemm(client, &x, &b, None, None, DType::I32),
        "dtype",
    );
    if !ops::caps::supports_dtype(client, DType::BF16) {
        assert_err(
            "bf16 layer",
            W8A8Linear::<R>::from_dense(client, &w, [5, 4], DType::BF16),
            "dtype",
        );
    }
}

#[test]
fn gemm8_matches_the_quantized_reference() {
    on_each_runtime!(gemm8_case);
}

#[test]
fn gemm8_kernel_choices_match_the_reference() {
    on_each_runtime!(gemm8_kernel_choices_case);
}

#[test]
fn w8a8_and_fp8_linears_match_reference_and_format_bound() {
    on_each_runtime!(linear8_case);
}

#[test]
fn w8a8_linear_into_uses_the_workspace() {
    on_each_runtime!(linear8_into_case);
}

#[test]
fn linear8_adds_the_residual_in_the_epilogue() {
    on_each_runtime!(linear8_residual_case);
}

#[test]
fn fp8_gemm_follows_the_contract() {
    on_each_runtime!(fp8_gemm_case);
}

#[test]
fn quantized_linears_reject_bad_inputs() {
    on_each_runtime!(errors_case);
}
