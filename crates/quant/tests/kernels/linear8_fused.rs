//! What the 8-bit layers fuse at decode sizes: the gated MLP's `SiLU(gate) * up` in the skinny
//! kernel's epilogue, and the input RMSNorm before the kernel quantizes the activation. Both
//! against the unfused arithmetic (the plain product, then the element-wise gate; the f64 norm,
//! then the same per-row quantization), on every runtime (elsewhere than CUDA the unfused paths
//! run and must give the same answers).

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, LinearWorkspace, NormedInput};
use ops::matmul::{Activation, InputNorm};
use ops::DType;
use quant::format::QuantFormat;
use quant::host::quantize_weight_8bit;
use quant::reference as qref;
use quant::{Fp8Linear, W8A8Linear};
use testkit::*;

use crate::gated_reference;

const FORMATS: [QuantFormat; 2] = [QuantFormat::Int8, QuantFormat::Fp8E4M3];
const EPS: f32 = 1e-6;

fn layer8<R: Runtime>(
    client: &ComputeClient<R>,
    fmt: QuantFormat,
    w: &[f32],
    shape: [usize; 2],
    dtype: DType,
) -> Box<dyn Linear<R>> {
    match fmt {
        QuantFormat::Int8 => Box::new(W8A8Linear::from_dense(client, w, shape, dtype).unwrap()),
        QuantFormat::Fp8E4M3 => Box::new(Fp8Linear::from_dense(client, w, shape, dtype).unwrap()),
    }
}

/// (M, I, K): M = 1, 3, 16 (the skinny kernel on CUDA), 17 (the pre-pass and SwiGLU); I not a
/// multiple of the 8-column tiles; on CUDA the model's gate-up width.
fn gated_shapes<R: Runtime>(client: &ComputeClient<R>) -> Vec<(usize, usize, usize)> {
    let mut s = vec![(1, 33, 96), (3, 40, 127), (16, 20, 64), (17, 24, 96)];
    if ops::caps::runtime_name(client) == "cuda" {
        s.extend([(1, 8960, 1536), (16, 1000, 1536)]);
    }
    s
}

fn gated_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(86);
    for fmt in FORMATS {
        for dtype in float_dtypes(client) {
            for (m, i, k) in gated_shapes(client) {
                let w = random(&mut rng, 2 * i * k, 0.5);
                let (xt, _) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
                let l = layer8(client, fmt, &w, [2 * i, k], dtype);
                let ws = LinearWorkspace::new(client, m, k, 2 * i, dtype);
                // The plain product (rounded to the dtype, as the gated epilogue rounds gate and
                // up before the activation), then the gate on the host.
                let plain = poisoned(client, &[m, 2 * i], dtype);
                l.forward_into(client, &xt, Epilogue::NONE, &plain, Some(&ws))
                    .unwrap();
                let want = gated_reference(&plain.to_f64_vec(client).unwrap(), m, 2 * i);
                let out = poisoned(client, &[m, i], dtype);
                let gated = Epilogue::NONE.gated(Activation::Silu);
                l.forward_into(client, &xt, gated, &out, Some(&ws)).unwrap();
                let what = format!("{fmt:?} gated {dtype} {m}x{i}x{k}");
                let got = out.to_f64_vec(client).unwrap();
                assert_close(&what, &got, &want, tolerance(dtype));
            }
        }
    }
}

/// (M, N, K): on CUDA the first three quantize x in the skinny kernel; rows of 17 000 are longer
/// than the pre-pass holds in registers, so it reads them again to apply the norm; the model's
/// down shape and (3, 1000, 4096) have the pre-pass normalize and quantize it for a kernel that
/// stages the codes in shared memory, and (16, 40, 1536) for one that reads them from global
/// memory.
fn normed_shapes<R: Runtime>(client: &ComputeClient<R>) -> Vec<(usize, usize, usize)> {
    let mut s = vec![
        (1, 33, 96),
        (3, 40, 127),
        (16, 24, 1000),
        (17, 40, 64),
        (1, 24, 17000),
        (16, 16, 17000),
    ];
    if ops::caps::runtime_name(client) == "cuda" {
        s.extend([(1, 1536, 8960), (3, 1000, 4096), (16, 40, 1536)]);
    }
    s
}

fn normed_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(87);
    for fmt in FORMATS {
        for dtype in float_dtypes(client) {
            for (m, n, k) in normed_shapes(client) {
                let x = rows_of_rising_scale(&mut rng, m, k);
                let (xt, xh) = upload(client, &x, &[m, k], dtype);
                let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
                let w = random(&mut rng, n * k, 0.5);
                let l = layer8(client, fmt, &w, [n, k], dtype);
                let ws = LinearWorkspace::new(client, m, k, n, dtype);
                let normed = poisoned(client, &[m, k], dtype);
                let out = poisoned(client, &[m, n], dtype);
                let norm = InputNorm {
                    weight: &g,
                    eps: EPS,
                };
                let input = NormedInput {
                    x: &xt,
                    norm,
                    normed: &normed,
                };
                l.forward_normed_into(client, input, Epilogue::NONE, &out, Some(&ws))
                    .unwrap();
                // The normalized activation as the kernels hold it (rounded to the dtype), then
                // the same quantized arithmetic on the host.
                let h = rms_norm_rounded(&xh, &gh, EPS, dtype);
                let qw = quantize_weight_8bit(&w, n, k, fmt).unwrap();
                let (cx, sx) = qref::quantize_rows(&h, m, k, fmt);
                let acc = qref::gemm_nt_codes(&cx, &qw.q.dense(), m, n, k, fmt);
                let want = qref::dequant_epilogue(&acc, m, n, &sx, &qw.scales, None);
                let what = format!("{fmt:?} normed {dtype} {m}x{n}x{k}");
                let got = out.to_f64_vec(client).unwrap();
                // A code may land one step apart where the device's f32 norm statistics and the
                // host's f64 ones round x̂ differently: a quantization step of tolerance.
                let tol = match fmt {
                    QuantFormat::Int8 => 2e-2,
                    QuantFormat::Fp8E4M3 => 7e-2,
                };
                assert_close(&what, &got, &want, tol.max(tolerance(dtype)));
            }
        }
    }
}

/// The gate-up projection as the model runs it: the input norm, the quantization and the gated
/// epilogue in one call, against the f64 norm, the host's quantized arithmetic and the gate
/// (gate and up rounded to the dtype first, as the epilogue rounds them). M = 1 and 16, I not
/// a multiple of the tiles, K not a multiple of the 64-byte chunks.
fn normed_gated_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(88);
    let mut shapes = vec![(1usize, 33usize, 96usize), (16, 20, 130), (17, 24, 96)];
    if ops::caps::runtime_name(client) == "cuda" {
        shapes.extend([(1, 8960, 1536), (16, 1000, 1536)]);
    }
    for fmt in FORMATS {
        for dtype in float_dtypes(client) {
            for &(m, i, k) in &shapes {
                let x = rows_of_rising_scale(&mut rng, m, k);
                let (xt, xh) = upload(client, &x, &[m, k], dtype);
                let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
                let w = random(&mut rng, 2 * i * k, 0.5);
                let l = layer8(client, fmt, &w, [2 * i, k], dtype);
                let ws = LinearWorkspace::new(client, m, k, 2 * i, dtype);
                let normed = poisoned(client, &[m, k], dtype);
                let out = poisoned(client, &[m, i], dtype);
                let input = NormedInput {
                    x: &xt,
                    norm: InputNorm {
                        weight: &g,
                        eps: EPS,
                    },
                    normed: &normed,
                };
                let gated = Epilogue::NONE.gated(Activation::Silu);
                l.forward_normed_into(client, input, gated, &out, Some(&ws))
                    .unwrap();
                let h = rms_norm_rounded(&xh, &gh, EPS, dtype);
                let qw = quantize_weight_8bit(&w, 2 * i, k, fmt).unwrap();
                let (cx, sx) = qref::quantize_rows(&h, m, k, fmt);
                let acc = qref::gemm_nt_codes(&cx, &qw.q.dense(), m, 2 * i, k, fmt);
                let product = qref::dequant_epilogue(&acc, m, 2 * i, &sx, &qw.scales, None);
                let product: Vec<f32> = product.iter().map(|&v| v as f32).collect();
                let want = gated_reference(&round_to(&product, dtype), m, 2 * i);
                let what = format!("{fmt:?} normed gated {dtype} {m}x{i}x{k}");
                let got = out.to_f64_vec(client).unwrap();
                // As `normed_case`, for a product of two such values.
                let tol = match fmt {
                    QuantFormat::Int8 => 4e-2,
                    QuantFormat::Fp8E4M3 => 1.4e-1,
                };
                assert_close(&what, &got, &want, tol.max(2.0 * tolerance(dtype)));
            }
        }
    }
}

#[test]
fn normed_gated_matches_reference() {
    on_each_runtime!(normed_gated_case);
}

#[test]
fn gated_epilogue_matches_unfused() {
    on_each_runtime!(gated_case);
}

#[test]
fn input_norm_matches_reference() {
    on_each_runtime!(normed_case);
}
