//! Cross-runtime correctness tests: every kernel against its CPU f64 reference, on every runtime
//! that is compiled in and present (see `harness`). One binary, one module per kernel family.

mod harness;

mod norm;
mod quant;

#[cfg(feature = "wgpu")]
mod burn;
