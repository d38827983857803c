//! cubellm: portable LLM-inference kernels written once in CubeCL.
//!
//! This facade re-exports the workspace crates and owns the runtime selection used by the CLI,
//! the tests and the benchmarks (the library crates themselves are generic over
//! `R: cubecl::Runtime` and never name a runtime).

pub use model;
pub use ops;
pub use quant;
pub use sparse;

pub mod bench;
pub mod runtime;
pub mod selfcheck;

pub use runtime::{Backend, RuntimeChoice, RuntimeError};
