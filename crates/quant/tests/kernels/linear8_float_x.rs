//! The 8-bit layers' float-activation decode paths: the SIMT kernel
//! (`KernelChoice::FloatActivationsSimt`, every runtime, M <= 16) in [`simt_case`], and the
//! tensor-core one (`KernelChoice::FloatActivations`). Where the latter
//! runs (CUDA, bf16 / f16, M <= 16): the dequantized weight times the float activation, with no
//! activation quantization, against the f64 reference, for the plain product with bias and
//! residual, the gated MLP, and both behind the input norm, on awkward shapes (N not a multiple
//! of the 16-column tiles, K not a multiple of the 64-k steps, M = 1, 3, 9 (two MMAs of x rows)
//! and 16), on the 1.5B model's projections as the model runs them (bf16), on gated launches of
//! several waves of cubes and on long-K launches of few tiles. Everywhere else (other runtimes
//! and dtypes, too many rows, a row-invariant workspace): the same bits as `KernelChoice::Auto`.

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, LinearWorkspace, NormedInput};
use ops::matmul::{Activation, InputNorm};
use ops::DType;
use quant::format::QuantFormat;
use quant::gemm8::runs_float_activations;
use quant::host::quantize_weight_8bit;
use quant::reference as qref;
use quant::{Fp8Linear, KernelChoice, W8A8Linear};
use testkit::*;

use crate::gated_reference;

const FORMATS: [QuantFormat; 2] = [QuantFormat::Int8, QuantFormat::Fp8E4M3];
/// The tensor-core kernel (CUDA, bf16 / f16).
const MMA: KernelChoice = KernelChoice::FloatActivations;
/// The SIMT kernel (every runtime and float dtype).
const SIMT: KernelChoice = KernelChoice::FloatActivationsSimt;
const EPS: f32 = 1e-6;

fn layer8<R: Runtime>(
    client: &ComputeClient<R>,
    fmt: QuantFormat,
    w: &[f32],
    shape: [usize; 2],
    dtype: DType,
    choice: KernelChoice,
) -> Box<dyn Linear<R>> {
    match fmt {
        QuantFormat::Int8 => Box::new(
            W8A8Linear::from_dense(client, w, shape, dtype)
                .unwrap()
                .with_kernel(choice),
        ),
        QuantFormat::Fp8E4M3 => Box::new(
            Fp8Linear::from_dense(client, w, shape, dtype)
                .unwrap()
                .with_kernel(choice),
        ),
    }
}

/// Awkward (M, N, K).
const SHAPES: [(usize, usize, usize); 4] =
    [(1, 40, 96), (3, 33, 208), (9, 24, 160), (16, 50, 1536)];

/// The 1.5B model's qkv, o and down products at one row as the model runs them, and down at 4
/// rows, whose x does not fit the kernel's shared memory (the codes path runs). Gate-up is in
/// [`gated_waves_case`].
const MODEL_CASES: [((usize, usize, usize), Variant); 4] = [
    ((1, 2048, 1536), Variant::Normed),
    ((1, 1536, 1536), Variant::Plain),
    ((1, 1536, 8960), Variant::Plain),
    ((4, 1536, 8960), Variant::Plain),
];

#[derive(Clone, Copy, Debug)]
enum Variant {
    /// Bias and residual in the epilogue.
    Plain,
    /// `SiLU(gate) * up` of a `[2N, K]` weight.
    Gated,
    /// The input RMSNorm, then the plain product.
    Normed,
    /// The input RMSNorm, then the gated product (the model's gate-up).
    NormedGated,
}

impl Variant {
    fn gated(self) -> bool {
        matches!(self, Variant::Gated | Variant::NormedGated)
    }

    fn normed(self) -> bool {
        matches!(self, Variant::Normed | Variant::NormedGated)
    }
}

/// Runs `layer` on x (normalized first by `g` when the variant asks) into a fresh output.
#[allow(clippy::too_many_arguments)]
fn run<R: Runtime>(
    client: &ComputeClient<R>,
    layer: &dyn Linear<R>,
    variant: Variant,
    x: &ops::DeviceTensor<R>,
    g: &ops::DeviceTensor<R>,
    bias: &ops::DeviceTensor<R>,
    residual: &ops::DeviceTensor<R>,
    ws: &LinearWorkspace<R>,
    out_shape: [usize; 2],
) -> Vec<f64> {
    let dtype = x.dtype();
    let out = poisoned(client, &out_shape, dtype);
    let epilogue = if variant.gated() {
        Epilogue::NONE.gated(Activation::Silu)
    } else {
        Epilogue::NONE.bias(Some(bias)).residual(residual)
    };
    if variant.normed() {
        let normed = poisoned(client, x.shape(), dtype);
        let input = NormedInput {
            x,
            norm: InputNorm {
                weight: g,
                eps: EPS,
            },
            normed: &normed,
        };
        layer
            .forward_normed_into(client, input, epilogue, &out, Some(ws))
            .unwrap();
    } else {
        layer
            .forward_into(client, x, epilogue, &out, Some(ws))
            .unwrap();
    }
    out.to_f64_vec(client).unwrap()
}

fn float_x_case<R: Runtime>(client: &ComputeClient<R>) {
    let variants = [
        Variant::Plain,
        Variant::Gated,
        Variant::Normed,
        Variant::NormedGated,
    ];
    float_x_cases(client, &SHAPES, &variants, &float_dtypes(client), 91);
}

/// [`MODEL_CASES`] in bf16, on CUDA (elsewhere the awkward shapes cover the fallback).
fn model_shapes_case<R: Runtime>(client: &ComputeClient<R>) {
    if ops::caps::runtime_name(client) != "cuda" {
        return;
    }
    for (shape, variant) in MODEL_CASES {
        float_x_cases(client, &[shape], &[variant], &[DType::BF16], 93);
    }
}

/// Gated launches of more 16-column tile groups than one wave of cubes holds on an H100 or
/// H200, on CUDA: the 1.5B model's gate-up at one row (560 groups), an awkward one at 5 rows
/// (532 groups, the last one partial, K not a whole number of steps) and one at 16 rows (313
/// groups, two MMAs of x rows; these two in bf16 only: every kernel of a case is compiled for
/// the device first).
fn gated_waves_case<R: Runtime>(client: &ComputeClient<R>) {
    // Elsewhere these run the codes path, which the awkward shapes already compare with.
    if ops::caps::runtime_name(client) != "cuda" {
        return;
    }
    let variants = [Variant::Gated, Variant::NormedGated];
    let dtypes = float_dtypes(client);
    float_x_cases(client, &[(1, 8960, 1536)], &variants, &dtypes, 92);
    let awkward = [(5, 8500, 1552), (16, 5000, 1552)];
    float_x_cases(client, &awkward, &variants, &[DType::BF16], 95);
}

/// Ungated launches of a long K on fewer tiles than SMs (as the down projection), on CUDA
/// (bf16: the f16 kernel differs only in its loads of x): N not a multiple of the tile and K
/// not a whole number of steps, at 1 and 7 rows, plain and behind the input norm.
fn long_k_case<R: Runtime>(client: &ComputeClient<R>) {
    if ops::caps::runtime_name(client) != "cuda" {
        return;
    }
    let shapes = [(1, 50, 4112), (7, 1500, 4176)];
    let variants = [Variant::Plain, Variant::Normed];
    float_x_cases(client, &shapes, &variants, &[DType::BF16], 94);
}

type XOf = fn(&mut rand::rngs::StdRng, usize, usize) -> Vec<f32>;

fn float_x_cases<R: Runtime>(
    client: &ComputeClient<R>,
    shapes: &[(usize, usize, usize)],
    variants: &[Variant],
    dtypes: &[DType],
    seed: u64,
) {
    float_x_cases_of(
        client,
        MMA,
        shapes,
        variants,
        dtypes,
        seed,
        rows_of_rising_scale,
    );
}

fn float_x_cases_of<R: Runtime>(
    client: &ComputeClient<R>,
    choice: KernelChoice,
    shapes: &[(usize, usize, usize)],
    variants: &[Variant],
    dtypes: &[DType],
    seed: u64,
    x_of: XOf,
) {
    let mut rng = rng(seed);
    for fmt in FORMATS {
        for &dtype in dtypes {
            for &(m, n, k) in shapes {
                for &variant in variants {
                    let rows = if variant.gated() { 2 * n } else { n };
                    let x = x_of(&mut rng, m, k);
                    let (xt, xh) = upload(client, &x, &[m, k], dtype);
                    let (g, gh) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
                    let (bias, bh) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
                    let (res, rh) = upload(client, &random(&mut rng, m * n, 1.0), &[m, n], dtype);
                    let w = random(&mut rng, rows * k, 0.5);
                    let ws = LinearWorkspace::new(client, m, k, rows, dtype);
                    let what = format!("{fmt:?} {variant:?} {dtype} {m}x{n}x{k}");
                    let what = format!("{choice:?} {what}");
                    let float = layer8(client, fmt, &w, [rows, k], dtype, choice);
                    let got = run(client, &*float, variant, &xt, &g, &bias, &res, &ws, [m, n]);
                    if !runs_float_activations(client, choice, fmt, dtype, m, k) {
                        let auto = layer8(client, fmt, &w, [rows, k], dtype, KernelChoice::Auto);
                        let want = run(client, &*auto, variant, &xt, &g, &bias, &res, &ws, [m, n]);
                        assert_bits(&what, &got, &want);
                        continue;
                    }
                    let h = if variant.normed() {
                        normalized(&xh, &gh, m, k)
                    } else {
                        xh.clone()
                    };
                    let wd = quantize_weight_8bit(&w, rows, k, fmt).unwrap().dequantize();
                    let product = qref::linear(&h, &wd, None, m, rows, k);
                    let want = if variant.gated() {
                        let p: Vec<f32> = product.iter().map(|&v| v as f32).collect();
                        gated_reference(&round_to(&p, dtype), m, rows)
                    } else {
                        (0..m * n).map(|e| product[e] + bh[e % n] + rh[e]).collect()
                    };
                    let tol = if variant.gated() { 2.0 } else { 1.0 } * tolerance(dtype);
                    assert_close(&what, &got, &want, tol);
                }
            }
        }
    }
}

/// Rows whose 64-k steps span twelve decades (1e-3 to 1e6, shifted by one decade triple per
/// row, the largest not first): x (and `x · g`) far outside f16's range in places and tiny in
/// others, so the kernel's f16 staging must scale it by the row's largest magnitude.
fn rows_of_wild_steps(rng: &mut rand::rngs::StdRng, m: usize, k: usize) -> Vec<f32> {
    let mut x = random(rng, m * k, 1.0);
    for (r, row) in x.chunks_mut(k).enumerate() {
        for (i, v) in row.iter_mut().enumerate() {
            *v *= 10f32.powi(3 * ((i / 64 + r) % 4) as i32 - 3);
        }
    }
    x
}

/// [`rows_of_wild_steps`] in bf16 (f16 cannot hold them) on awkward shapes, every variant.
fn wild_steps_case<R: Runtime>(client: &ComputeClient<R>) {
    if !float_dtypes(client).contains(&DType::BF16) {
        return;
    }
    let variants = [
        Variant::Plain,
        Variant::Gated,
        Variant::Normed,
        Variant::NormedGated,
    ];
    let shapes = [(1, 40, 1552), (3, 33, 640), (9, 24, 400)];
    float_x_cases_of(
        client,
        MMA,
        &shapes,
        &variants,
        &[DType::BF16],
        96,
        rows_of_wild_steps,
    );
}

/// `x · rstd · g` per row in f64 (the kernel rounds `x · g`, scaled by a power of two, to f16
/// once, and applies `rstd` to the sums).
fn normalized(x: &[f64], g: &[f64], m: usize, k: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(m * k);
    for row in x.chunks(k) {
        let rstd = ops::reference::norm::inv_rms(row, EPS as f64);
        out.extend(row.iter().zip(g).map(|(v, w)| v * rstd * w));
    }
    out
}

fn assert_bits(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} got {} want {} (the codes path's)",
            got[i], want[i]
        );
    }
}

/// A row-invariant workspace (continuous batching) keeps the codes path: the float kernel's
/// launch shape changes with M.
fn rows_invariant_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(92);
    let (m, n, k) = (1, 40, 96);
    for fmt in FORMATS {
        for dtype in float_dtypes(client) {
            let (xt, _) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let (g, _) = upload(client, &random(&mut rng, k, 1.0), &[k], dtype);
            let (bias, _) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
            let (res, _) = upload(client, &random(&mut rng, m * n, 1.0), &[m, n], dtype);
            let w = random(&mut rng, n * k, 0.5);
            let ws = LinearWorkspace::new(client, m, k, n, dtype).rows_invariant(true);
            let auto = layer8(client, fmt, &w, [n, k], dtype, KernelChoice::Auto);
            for choice in [MMA, SIMT] {
                let float = layer8(client, fmt, &w, [n, k], dtype, choice);
                for variant in [Variant::Plain, Variant::Normed] {
                    let what = format!("{choice:?} {fmt:?} {variant:?} {dtype} rows-invariant");
                    let got = run(client, &*float, variant, &xt, &g, &bias, &res, &ws, [m, n]);
                    let want = run(client, &*auto, variant, &xt, &g, &bias, &res, &ws, [m, n]);
                    assert_bits(&what, &got, &want);
                }
            }
        }
    }
}

/// The SIMT kernel against the f64 reference on every runtime and float dtype: the awkward
/// shapes (K = 208: 13 weight vectors, fewer than a plane's lanes; N not a multiple of a cube's
/// columns; two rows of an odd N, whose ungated groups of two columns end half past N) in every
/// variant, the 1.5B model's four products as the model runs them (gate-up
/// 8 960 columns of 2 x 1 536, qkv, o; down's K at 16 rows), a long K split over planes at 7
/// rows and at one row, and rows spanning twelve decades (which need no scaling in f32).
fn simt_case<R: Runtime>(client: &ComputeClient<R>) {
    let variants = [
        Variant::Plain,
        Variant::Gated,
        Variant::Normed,
        Variant::NormedGated,
    ];
    let dtypes = float_dtypes(client);
    let rising = rows_of_rising_scale;
    float_x_cases_of(client, SIMT, &SHAPES, &variants, &dtypes, 97, rising);
    // Two rows, N odd: ungated, two columns a group and the last group half past N.
    float_x_cases_of(
        client,
        SIMT,
        &[(2, 33, 208)],
        &variants,
        &dtypes,
        100,
        rising,
    );
    let model = [
        ((1, 8960, 1536), Variant::NormedGated),
        ((1, 2048, 1536), Variant::Normed),
        ((1, 1536, 1536), Variant::Plain),
        ((16, 40, 8960), Variant::Plain),
        ((7, 50, 4176), Variant::Normed),
    ];
    for (shape, variant) in model {
        float_x_cases_of(client, SIMT, &[shape], &[variant], &dtypes[..1], 98, rising);
    }
    // One row over a long K (1 025 weight vectors over 8 x 32 lanes: five steps a lane).
    let shapes = [(1, 40, 1552), (3, 33, 640), (1, 20, 16400)];
    float_x_cases_of(
        client,
        SIMT,
        &shapes,
        &variants,
        &dtypes[..1],
        99,
        rows_of_wild_steps,
    );
}

#[test]
fn float_activations_simt_match_reference() {
    on_each_runtime!(simt_case);
}

#[test]
fn float_activations_match_reference() {
    on_each_runtime!(float_x_case);
}

#[test]
fn float_activations_match_reference_at_model_shapes() {
    on_each_runtime!(model_shapes_case);
}

#[test]
fn float_activations_gated_past_one_wave() {
    on_each_runtime!(gated_waves_case);
}

#[test]
fn float_activations_long_k_on_few_tiles() {
    on_each_runtime!(long_k_case);
}

#[test]
fn float_activations_scale_rows_past_f16_range() {
    on_each_runtime!(wild_steps_case);
}

#[test]
fn float_activations_keep_codes_when_rows_invariant() {
    on_each_runtime!(rows_invariant_case);
}
