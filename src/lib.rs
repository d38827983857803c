//! cubellm: portable LLM-inference kernels written once in CubeCL.
//!
//! A facade over the workspace crates, for projects that want all of them under one name:
//!
//! | module | crate | what |
//! |---|---|---|
//! | [`ops`] | `cubellm-ops` | device tensor, errors, core kernels (norms, RoPE, attention, GEMM/GEMV, fused ops), the [`ops::linear::Linear`] capability |
//! | [`quant`] | `cubellm-quant` | int8 / fp8 / int4 formats, their GEMMs and linear layers |
//! | [`sparse`] | `cubellm-sparse` | block-sparse (BSR) matmul and its linear layer |
//! | [`model`] | `cubellm-model` | model families (Qwen2, Qwen3, Llama), the engine, tokenizer, sampling, generation |
//! | [`runtime`] | `cubellm-runtime` | picking a runtime (`cuda`, `wgpu`, `auto`) and running generic code on it |
//!
//! The library crates are generic over `R: cubecl::Runtime` and never name a runtime; this
//! facade's features `cuda` and `wgpu` (both default) choose what [`runtime`] compiles in.

pub use model;
pub use ops;
pub use quant;
pub use runtime;
pub use sparse;

pub use runtime::{with_runtime, Backend, RuntimeChoice, RuntimeError};
