//! The typed error every public launch function returns before anything is launched.

use crate::DType;

/// Why an op refused its inputs (or why the device failed it).
///
/// Every variant names the op, so that a message shown to a user says where it came from.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum OpsError {
    /// Input shapes that do not fit together, or do not fit the op.
    #[error("{op}: shape mismatch: {detail}")]
    ShapeMismatch { op: &'static str, detail: String },
    /// The dtype is not accepted by the op, or not supported by the runtime (bf16 on wgpu).
    #[error("{op}: unsupported dtype {dtype} on {runtime}: {detail}")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        runtime: &'static str,
        detail: String,
    },
    /// The runtime lacks a feature the op needs and has no fallback for.
    #[error("{op}: the {runtime} runtime lacks a required feature: {feature}")]
    UnsupportedFeature {
        op: &'static str,
        runtime: &'static str,
        feature: String,
    },
    /// A scalar argument or index that is out of its domain.
    #[error("{op}: invalid argument: {detail}")]
    InvalidArgument { op: &'static str, detail: String },
    /// The device failed a read or an execution.
    #[error("{op}: device error: {detail}")]
    Device { op: &'static str, detail: String },
}

impl OpsError {
    pub fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        Self::ShapeMismatch {
            op,
            detail: detail.into(),
        }
    }

    pub fn invalid(op: &'static str, detail: impl Into<String>) -> Self {
        Self::InvalidArgument {
            op,
            detail: detail.into(),
        }
    }

    /// A short machine-readable kind, handy in tests and in the CLI.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ShapeMismatch { .. } => "shape",
            Self::UnsupportedDType { .. } => "dtype",
            Self::UnsupportedFeature { .. } => "feature",
            Self::InvalidArgument { .. } => "argument",
            Self::Device { .. } => "device",
        }
    }
}

pub type Result<T, E = OpsError> = std::result::Result<T, E>;
