//! An int8 copy of a float LM head for greedy decoding's screened argmax
//! ([`ops::argmax::screened`]): the approximate logits come from the SIMT 8-bit GEMV on the float
//! activation (half the bytes of a bf16 head), and each row's coefficient bounds how far they can
//! be from the float GEMV's, so that the screened argmax returns the float head's id exactly.
//!
//! The bound of row `i`, for any input `x` (as exact f32 values; ‖x‖₂ its norm):
//!
//! ```text
//! |y_i - â_i| <= ‖x‖₂ · ( ‖w_i - s_i q_i‖₂ + γ_K ‖w_i‖₂ + γ_{K+2} s_i ‖q_i‖₂ )
//! ```
//!
//! where `y_i` is the float GEMV's f32 sum of the K exact products `x_k w_ik` (off from the real
//! dot product by at most `γ_K Σ|x_k w_ik|`, `γ_n = n·2^-24 / (1 - n·2^-24)`), and `â_i` the
//! 8-bit kernel's f32 result, `s_i · Σ x_k q_ik` with its sum and the final scaling rounded (at
//! most `γ_{K+2} s_i Σ|x_k q_ik|` from the real value); the first term is the quantization
//! error, exact up to the f64 arithmetic here. Cauchy-Schwarz turns each `Σ|x_k v_k|` into
//! `‖x‖₂‖v‖₂`. The coefficients carry 1% to spare for the f64 evaluation and are rounded up.
//! The bound holds only for a kernel that multiplies the float activation without rounding it:
//! the SIMT kernel ([`KernelChoice::FloatActivationsSimt`]), which this head always runs.

use cubecl::prelude::*;
use ops::{DType, DeviceTensor, OpsError, Result};

use crate::gemm8::{runs_float_activations, KernelChoice};
use crate::host::{quantize_weight_8bit, QuantizedWeight8};
use crate::{QuantFormat, W8A8Linear};

/// The approximate head and its coefficients.
pub struct ScreeningHead<R: Runtime> {
    /// The int8 copy, on the SIMT float-activation kernel.
    pub linear: W8A8Linear<R>,
    /// `f32[V]`: the bound coefficients ([`ops::argmax::screened::Screened::coef`]).
    pub coef: DeviceTensor<R>,
}

/// `γ_n`: the relative error bound of an f32 sum of `n` terms.
fn gamma(n: usize) -> f64 {
    let u = n as f64 * 2f64.powi(-24);
    u / (1.0 - u)
}

/// Whether a screening head runs for activations of `dtype` and `k` inputs on this runtime
/// (the SIMT 8-bit kernel at one row).
pub fn can_screen<R: Runtime>(client: &ComputeClient<R>, dtype: DType, k: usize) -> bool {
    runs_float_activations(
        client,
        KernelChoice::FloatActivationsSimt,
        QuantFormat::Int8,
        dtype,
        1,
        k,
    )
}

/// The coefficients of `q`, the int8 copy of `w` (`[n, k]`, f32 values as the float head holds
/// them): see the module's bound.
pub fn screen_coefficients(w: &[f32], q: &QuantizedWeight8) -> Vec<f32> {
    let (n, k) = (q.q.rows, q.q.cols);
    let (gk, gq) = (gamma(k), gamma(k + 2));
    let mut coef = vec![0f32; n];
    let rows = n.div_ceil(std::thread::available_parallelism().map_or(1, |p| p.get().min(16)));
    std::thread::scope(|scope| {
        for (run, (out, w_run)) in coef.chunks_mut(rows).zip(w.chunks(rows * k)).enumerate() {
            scope.spawn(move || {
                for (j, (c, row)) in out.iter_mut().zip(w_run.chunks(k)).enumerate() {
                    let r = run * rows + j;
                    let s = q.scales[r] as f64;
                    let (mut err, mut wn, mut qn) = (0f64, 0f64, 0f64);
                    for (col, &v) in row.iter().enumerate() {
                        let code = q.format.decode(q.q.get(r, col));
                        let (v, e) = (v as f64, v as f64 - s * code);
                        err += e * e;
                        wn += v * v;
                        qn += code * code;
                    }
                    let bound = err.sqrt() + gk * wn.sqrt() + gq * s * qn.sqrt();
                    *c = next_up((bound * 1.01) as f32);
                }
            });
        }
    });
    coef
}

/// The next f32 above a finite non-negative `v` (the f64 → f32 conversion rounds to nearest).
fn next_up(v: f32) -> f32 {
    f32::from_bits(v.to_bits() + 1)
}

/// The screening head of a float head `w[n, k]` (row-major f32 values as the float head holds
/// them, i.e. already rounded to `dtype`) for activations of `dtype`: `UnsupportedFeature`
/// where the SIMT 8-bit kernel does not run ([`can_screen`]).
pub fn screening_head<R: Runtime>(
    client: &ComputeClient<R>,
    w: &[f32],
    [n, k]: [usize; 2],
    dtype: DType,
) -> Result<ScreeningHead<R>> {
    if !can_screen(client, dtype, k) {
        return Err(OpsError::UnsupportedFeature {
            op: "screening head",
            feature: format!(
                "the SIMT 8-bit GEMV for {dtype} at K = {k} (K must be a multiple of 16)"
            ),
            runtime: ops::caps::runtime_name(client),
        });
    }
    let q = quantize_weight_8bit(w, n, k, QuantFormat::Int8)?;
    let coef = screen_coefficients(w, &q);
    Ok(ScreeningHead {
        linear: W8A8Linear::from_quantized(client, &q, dtype)?
            .with_kernel(KernelChoice::FloatActivationsSimt),
        coef: DeviceTensor::from_slice(client, &coef, &[n])?,
    })
}
