//! The layer's int4 kernels on the tensor cores (CUDA, bf16/f16): the decode GEMV and the prefill
//! GEMM, each against the f64 reference of the same quantized product; elsewhere the same
//! shapes run the portable kernels and the same checks apply.

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, NormedInput};
use ops::matmul::InputNorm;
use ops::{caps, DType};
use quant::host;
use quant::reference as qref;
use quant::W4A16Linear;
use testkit::*;

use super::{check_bias_residual, check_gated, norm_staged};
use crate::gated_reference;

/// The layer's decode GEMV on the tensor cores (CUDA, bf16/f16; elsewhere these shapes run the
/// CUDA-core GEMV and the same checks apply): K past whole 128-k steps (1056: a partial last
/// step), N past whole 16-column tiles and cubes of several tiles (K of 3-4 steps), per-channel
/// scales and groups of 128 and 256, 1 to 16 rows (x rows 8..16 go through a second MMA), x
/// staged whole or in chunks of steps, bias, residual, the gated MLP and the input norm, against
/// the f64 reference of the same quantized product.
fn tensor_core_case<R: Runtime>(client: &ComputeClient<R>) {
    let shapes = [
        (1usize, 1056usize, 38usize, None),
        (1, 1536, 70, Some(128)),
        (3, 2304, 24, Some(256)),
        (9, 640, 18, Some(128)),
        (16, 512, 40, None),
        (1, 4480, 20, Some(128)),
        // The 1.5B model's down projection's K (70 steps, x staged whole) at one row and, with
        // per-channel scales, at two.
        (1, 8960, 40, Some(128)),
        (2, 8960, 20, None),
        // Three steps: tiles of four warps, two to a cube; 44 columns: the last cube's tiles
        // partly and wholly past N; gated (22): one cube, its second tile partly past N.
        (1, 384, 44, Some(128)),
        // 16 rows at the 1.5B model's hidden size (48 KB of x, staged whole); then x staged in
        // chunks of steps (M x K past the stage): 8 rows over 70 steps (the last chunk partly
        // past K), 12 rows with per-channel scales, 5 rows with groups of two steps.
        (16, 1536, 40, Some(128)),
        (8, 8960, 24, Some(128)),
        (12, 4480, 20, None),
        (5, 8960, 18, Some(256)),
    ];
    check_tensor_core_shapes(client, &shapes, 403);
}

/// The gated decode GEMV with more tile groups than one wave of cubes holds, so that each cube
/// multiplies several (CUDA, bf16/f16; these shapes are skipped elsewhere): the 1.5B model's
/// gate-up with 8 more columns (561 tiles, the last partly past N) at one row, at 16 rows (x rows
/// 8..16 through the second MMA), at 5 rows with half its K (6 steps on 8 warps: still one tile
/// per cube), and at one row with a K past whole steps (1 056, per-channel scales). Elsewhere
/// the check is that the layer does not choose the tensor-core kernel, whose launch this is.
fn tile_groups_case<R: Runtime>(client: &ComputeClient<R>) {
    let cuda = caps::runtime_name(client).contains("cuda");
    if !cuda {
        let w = random(&mut rng(409), 16 * 128, 0.5);
        for dtype in float_dtypes(client) {
            let layer = W4A16Linear::from_dense(client, &w, [16, 128], dtype, Some(128)).unwrap();
            assert!(!layer.decodes_on_tensor_cores(client, 1), "{dtype}");
        }
        eprintln!(
            "tile-group shapes skipped on {}: no tensor-core int4 GEMV",
            caps::runtime_name(client)
        );
        return;
    }
    check_tensor_core_shapes(
        client,
        &[
            (1, 1536, 17936, Some(128)),
            (16, 1536, 17936, Some(128)),
            (5, 768, 17936, Some(128)),
            (1, 1056, 17936, None),
        ],
        409,
    );
}

/// The checks of [`tensor_core_case`] on `shapes` (`(m, k, n, group)`), each against the f64
/// reference of the same quantized product.
fn check_tensor_core_shapes<R: Runtime>(
    client: &ComputeClient<R>,
    shapes: &[(usize, usize, usize, Option<usize>)],
    seed: u64,
) {
    const EPS: f32 = 1e-6;
    let mut rng = rng(seed);
    let cuda = caps::runtime_name(client).contains("cuda");
    for dtype in float_dtypes(client) {
        for (i, &(m, k, n, group)) in shapes.iter().enumerate() {
            // Without the tensor-core kernel these shapes run the CUDA-core GEMV, which the
            // cases above cover: two of them suffice there (each shape is a kernel compile,
            // slow on a software Vulkan device).
            if !cuda && !matches!(i, 0 | 3) {
                continue;
            }
            // The tile-group shapes test the tensor-core kernel's launch, which f32 never takes.
            if m * k * n > 16 << 20 && dtype == DType::F32 {
                continue;
            }
            let w = random(&mut rng, n * k, 0.5);
            let layer = W4A16Linear::from_dense(client, &w, [n, k], dtype, group).unwrap();
            let mma = layer.decodes_on_tensor_cores(client, m);
            let what = format!("tensor-core {dtype} {m}x{k}x{n} group {group:?} (mma {mma})");
            // On CUDA every bf16/f16 case here must take the tensor-core kernel.
            assert_eq!(mma, cuda && dtype != DType::F32, "{what}: kernel choice");
            let qw = host::quantize_weight_int4(&w, n, k, group).unwrap();
            let x = rows_of_rising_scale(&mut rng, m, k);
            let (xt, xh) = upload(client, &x, &[m, k], dtype);
            let product = qref::w4a16(&xh, m, &qw, None);

            let bias = random(&mut rng, n, 1.0);
            let residual = random(&mut rng, m * n, 1.0);
            check_bias_residual(client, &layer, &xt, &product, &bias, &residual, &what);

            // The input norm with the gated epilogue (gate rows, then up rows).
            let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
            let normed = poisoned(client, &[m, k], dtype);
            let input = NormedInput {
                x: &xt,
                norm: InputNorm {
                    weight: &g,
                    eps: EPS,
                },
                normed: &normed,
            };
            // In bf16 the tensor-core kernel stages `x · g` and scales the sums by `rstd`;
            // otherwise x is normalised first (two roundings).
            let h = if mma && dtype == DType::BF16 {
                norm_staged(&xh, &gh, k, EPS, dtype)
            } else {
                rms_norm_rounded(&xh, &gh, EPS, dtype)
            };
            let product = qref::w4a16(&h, m, &qw, None);
            let i = n / 2;
            let out = poisoned(client, &[m, i], dtype);
            let gated = Epilogue::NONE.gated(ops::matmul::Activation::Silu);
            layer
                .forward_normed_into(client, input, gated, &out, None)
                .unwrap();
            let want = gated_reference(&product, m, n);
            let got = out.to_f64_vec(client).unwrap();
            assert_close(
                &format!("{what} normed gated"),
                &got,
                &want,
                2.0 * tolerance(dtype),
            );
        }
    }
}

/// The layer's prefill GEMM on the tensor cores (CUDA, bf16/f16; elsewhere the dequantizing
/// path runs and the same checks apply): M past whole 128-row tiles, N past whole tiles, K of a
/// few 32-k steps, groups of one step, per-channel scales, K split over 8 slices of which the
/// last is shorter (125 steps) and over 2, bias with residual through the split's sum, and the
/// gated MLP (64-column tiles, the last partly past N), against the f64 reference of the same
/// quantized product.
fn prefill_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(404);
    let cuda = caps::runtime_name(client).contains("cuda");
    let shapes = [
        (17usize, 256usize, 70usize, Some(128)),
        (130, 96, 300, Some(32)),
        (40, 4000, 200, Some(160)),
        (300, 1024, 264, None),
        (64, 512, 136, Some(64)),
    ];
    for dtype in float_dtypes(client) {
        for (i, &(m, k, n, group)) in shapes.iter().enumerate() {
            // Elsewhere these shapes dequantize and run the dense GEMM, which `layer_case`
            // covers: one shape suffices there (each is a kernel compile, slow on a software
            // Vulkan device).
            if !cuda && i != 0 {
                continue;
            }
            let w = random(&mut rng, n * k, 0.5);
            let layer = W4A16Linear::from_dense(client, &w, [n, k], dtype, group).unwrap();
            let tc = layer.prefills_on_tensor_cores(client);
            let what = format!("prefill {dtype} {m}x{k}x{n} group {group:?} (mma {tc})");
            // On CUDA every bf16/f16 case here must take the tensor-core kernel.
            assert_eq!(tc, cuda && dtype != DType::F32, "{what}: kernel choice");
            let qw = host::quantize_weight_int4(&w, n, k, group).unwrap();
            let (x, xr) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let product = qref::w4a16(&xr, m, &qw, None);

            let bias = random(&mut rng, n, 1.0);
            let residual = random(&mut rng, m * n, 1.0);
            check_bias_residual(client, &layer, &x, &product, &bias, &residual, &what);

            check_gated(client, &layer, &x, &product, &what);
        }
    }
}

#[test]
fn tensor_core_decode() {
    on_each_runtime!(tensor_core_case);
}

#[test]
fn tensor_core_decode_tile_groups() {
    on_each_runtime!(tile_groups_case);
}

#[test]
fn tensor_core_prefill() {
    on_each_runtime!(prefill_case);
}
