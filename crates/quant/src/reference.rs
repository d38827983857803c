//! CPU references, in f64, of the same quantized arithmetic the kernels perform. The tests
//! compare against these (exactly for the integer parts), and separately bound the quantization
//! error against the float product.

use crate::format::{scale_for, QuantFormat};
use crate::host::Int4Weight;

/// Per-row quantization of `x[M, K]` exactly as [`crate::rowquant`] does it: returns the dense
/// codes `[M, K]` and the scales `[M]`. `x` must hold values representable in f32.
pub fn quantize_rows(x: &[f64], m: usize, k: usize, format: QuantFormat) -> (Vec<u8>, Vec<f32>) {
    let mut codes = Vec::with_capacity(m * k);
    let mut scales = Vec::with_capacity(m);
    for r in 0..m {
        let row = &x[r * k..(r + 1) * k];
        let amax = row.iter().fold(0f32, |a, &v| a.max((v as f32).abs()));
        let s = scale_for(amax, format.qmax());
        codes.extend(row.iter().map(|&v| format.encode(v as f32 / s)));
        scales.push(s);
    }
    (codes, scales)
}

/// `C[m, n] = Σ_k A[m, k] · B[n, k]` over decoded codes (the integer accumulators for int8;
/// exact in f64 for fp8 too, as every e4m3 product and these sums are exact).
pub fn gemm_nt_codes(
    a: &[u8],
    b: &[u8],
    m: usize,
    n: usize,
    k: usize,
    format: QuantFormat,
) -> Vec<f64> {
    let da: Vec<f64> = a.iter().map(|&c| format.decode(c)).collect();
    let db: Vec<f64> = b.iter().map(|&c| format.decode(c)).collect();
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|t| da[i * k + t] * db[j * k + t]).sum();
        }
    }
    out
}

/// The dequantizing epilogue: `acc[m, n] * sa[m or 0] * sb[n or 0] (+ bias[n])`.
pub fn dequant_epilogue(
    acc: &[f64],
    m: usize,
    n: usize,
    sa: &[f32],
    sb: &[f32],
    bias: Option<&[f64]>,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let a = sa[if sa.len() == 1 { 0 } else { i }] as f64;
            let b = sb[if sb.len() == 1 { 0 } else { j }] as f64;
            out[i * n + j] = acc[i * n + j] * a * b + bias.map_or(0.0, |v| v[j]);
        }
    }
    out
}

/// `y = x · wᵀ (+ b)` in f64 for `x[M, K]`, `w[N, K]`: the float product the quantized ops
/// approximate.
pub fn linear(
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum();
            out[i * n + j] = dot + bias.map_or(0.0, |v| v[j]);
        }
    }
    out
}

/// W4A16: `y = x · dequant(w)ᵀ (+ b)` with `dequant(w)[n, k] = q[k, n] · scale(k, n)`.
pub fn w4a16(x: &[f64], m: usize, w: &Int4Weight, bias: Option<&[f64]>) -> Vec<f64> {
    linear(x, &w.dequantize(), bias, m, w.n, w.k)
}

/// Per-column quantization of a float `b[K, N]` (row-major): the codes of `bᵀ` as `[N, K]` and
/// the scales `[N]`, as `fp8_gemm` quantizes its second operand.
pub fn quantize_cols(b: &[f64], k: usize, n: usize, format: QuantFormat) -> (Vec<u8>, Vec<f32>) {
    let bt: Vec<f64> = (0..n)
        .flat_map(|j| (0..k).map(move |t| (j, t)))
        .map(|(j, t)| b[t * n + j])
        .collect();
    quantize_rows(&bt, n, k, format)
}
