//! Cross-runtime correctness tests of the quantization crate: formats, per-row quantization,
//! the 8-bit GEMMs and W4A16, against their CPU f64 references on every runtime present
//! (`testkit`).

mod gemm8;
mod linear8_fused;
mod rowquant;
mod w4a16;
