//! Cross-runtime correctness tests of the quantization crate: formats, per-row quantization,
//! the 8-bit GEMMs and W4A16, against their CPU f64 references on every runtime present
//! (`testkit`).

mod gemm8;
mod linear8_float_x;
mod linear8_fused;
mod rowquant;
mod screen;
mod w4a16;

/// The gated MLP's reference over an f64 product of `n` columns per row (the first `n / 2` the
/// gate, the rest the matching up columns): `silu(gate) * up`, `[m, n / 2]`.
pub(crate) fn gated_reference(product: &[f64], m: usize, n: usize) -> Vec<f64> {
    let half = n / 2;
    (0..m * half)
        .map(|e| {
            let (row, col) = (e / half, e % half);
            ops::reference::matmul::silu(product[row * n + col]) * product[row * n + half + col]
        })
        .collect()
}
