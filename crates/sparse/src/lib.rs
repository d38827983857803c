//! Block-sparse (BSR) weights and the dense x block-sparse matmul, written once in CubeCL.
//!
//! - [`Bsr`]: a `[N, K]` weight in PyTorch's BSR layout on the device, built from a dense matrix
//!   (keeping non-zero blocks), by pruning to a block sparsity (largest L2 norms), or from raw
//!   arrays (validated, one [`SparseError`] variant per violation).
//! - [`bsr_linear`] / [`bsr_linear_into`]: `y = x · Wᵀ (+ bias)` that skips absent blocks, with
//!   tensor cores on CUDA (f16/bf16) and a portable path elsewhere; f32 accumulation.
//! - [`SparseLinear`]: the layer built on them.

pub mod bsr;
pub mod error;
pub mod layer;
pub mod linear;
pub mod reference;

pub use bsr::{validate_bsr, Bsr, WorkItems};
pub use error::SparseError;
pub use layer::SparseLinear;
pub use linear::{bsr_linear, bsr_linear_into, bsr_linear_into_tuned, Tuning, SUPPORTED_BLOCKS};
