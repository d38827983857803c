//! Cross-runtime correctness tests: every kernel against its CPU f64 reference, on every runtime
//! that is compiled in and present (see `harness`). One binary, one module per kernel family.

mod harness;

mod argmax;
mod attention;
mod elementwise;
mod embedding;
mod matmul;
mod norm;
// The patched CUDA runtime's PDL prologue (vendor/cubecl-cuda/PATCHED.md): its source and PTX
// checks are std only, so they are tested here, without a GPU.
#[path = "../../vendor/cubecl-cuda/src/pdl/prologue.rs"]
mod pdl_prologue;
mod qkv;
mod quant;
mod quant_gemm8;
mod quant_w4a16;
mod rope;
mod softmax;
mod sparse;

#[cfg(feature = "wgpu")]
mod burn;
