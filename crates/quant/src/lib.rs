//! Quantized inference kernels: per-row int8 / fp8 (e4m3) activation quantization, W8A8 and
//! FP8 GEMMs (`mma.sync` tensor-core kernels on CUDA, verified on an H100; a portable kernel
//! everywhere else), W4A16 GEMM/GEMV with int4 weights packed 8 per i32, and the quantized
//! linear layers built on them.
//!
//! Semantics: symmetric quantization (`s = max|r| / Qmax`, no zero point), per-token activation
//! scales, per-output-channel weight scales, group-wise int4 as an option; the exact rules live in
//! [`mod@format`] and are shared by the host encoders, the kernels ([`codec`]) and the references.
//! Every public op validates its inputs and returns [`ops::OpsError`] before launching.

pub mod codec;
pub mod format;
pub mod fp8;
pub mod gemm8;
pub mod host;
pub mod layout;
pub mod linear8;
pub mod reference;
pub mod rowquant;
pub mod screen;
mod tile_sums;
pub mod transpose;
pub mod w4a16;
mod w4a16_fragments;
mod w4a16_gemm;
mod w4a16_layer;
mod w4a16_mma;
mod w4a16_nk;

pub use format::QuantFormat;
pub use fp8::fp8_gemm;
pub use gemm8::KernelChoice;
pub use linear8::{gemm8_into, w8a8_linear, w8a8_linear_into, ActScratch, Fp8Linear, W8A8Linear};
pub use rowquant::{quantize_per_row, quantize_per_row_into};
pub use w4a16::{w4a16_linear, w4a16_linear_into, W4a16Kernel};
pub use w4a16_layer::W4A16Linear;
