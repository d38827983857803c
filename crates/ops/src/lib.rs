//! Core GPU kernels for LLM inference, written once in CubeCL and generic over the runtime.
//!
//! Every op validates its inputs and returns [`OpsError`] before launching anything. Ops take
//! [`DeviceTensor`]s and a `ComputeClient<R>`; each has an `_into` form that writes into
//! preallocated outputs so that a decode step can run without allocating.

pub mod argmax;
pub mod attention;
#[cfg(feature = "burn")]
pub mod burn;
pub mod caps;
pub mod dtype;
pub mod elementwise;
pub mod embedding;
pub mod error;
pub mod gemm;
pub mod launch;
pub mod linear;
pub mod matmul;
pub mod norm;
pub mod online_softmax;
pub mod pdl;
pub mod qkv;
pub mod reduce;
pub mod reference;
pub mod rope;
pub mod sampling;
pub mod softmax;
pub mod tensor;

pub use dtype::{DType, HostElement};
pub use error::{OpsError, Result};
pub use tensor::{DeviceTensor, PendingRead};

pub use cubecl;
