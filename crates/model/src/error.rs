//! The one error type of the model crate.
//!
//! Every message is one line and names what it is about (a file, a tensor, a config field, a
//! sampling parameter), because it ends up in front of a user of the CLI as it is.

use std::path::PathBuf;

/// Why loading a model or generating from it failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file or directory could not be read.
    #[error("{path}: {detail}")]
    Io { path: PathBuf, detail: String },
    /// A JSON file (config, tokenizer config, index) is not valid JSON or not the expected shape.
    #[error("{path}: invalid JSON: {detail}")]
    Json { path: PathBuf, detail: String },
    /// A config field is missing, has the wrong type, or a value the model cannot use.
    #[error("{path}: field '{field}': {detail}")]
    Config {
        path: PathBuf,
        field: String,
        detail: String,
    },
    /// The checkpoint is not of a supported family.
    #[error("{path}: unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArchitecture {
        path: PathBuf,
        arch: String,
        supported: String,
    },
    /// A safetensors file is truncated, corrupt or otherwise unreadable.
    #[error("{path}: not a valid safetensors file: {detail}")]
    Safetensors { path: PathBuf, detail: String },
    /// A tensor the architecture needs is absent from the checkpoint.
    #[error("missing tensor '{name}' in {path}")]
    MissingTensor { name: String, path: PathBuf },
    /// A tensor exists but has another shape than the config implies.
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?} (from config.json)")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A tensor has a dtype the loader cannot convert (only f32, f16 and bf16 are accepted).
    #[error("tensor '{name}' has dtype {found}, expected F32, F16 or BF16")]
    TensorDType { name: String, found: String },
    /// A tensor's values cannot be represented in the compute dtype (e.g. > 65504 in f16).
    #[error("tensor '{name}': {detail}")]
    TensorValue { name: String, detail: String },
    /// The tokenizer files are missing or cannot be used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template does not parse or fails to render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// An invalid sampling or generation parameter.
    #[error("invalid parameter {name}: {detail}")]
    InvalidParameter { name: &'static str, detail: String },
    /// The prompt (plus at least one new token) does not fit into the context.
    #[error("context overflow: {needed} tokens needed but the context holds {max_len} (raise --max-len or shorten the prompt)")]
    ContextOverflow { needed: usize, max_len: usize },
    /// The model and its context do not fit in the device's memory (checked before anything is
    /// allocated), or the device ran out of memory.
    #[error("device memory: {0}")]
    DeviceMemory(String),
    /// The compute dtype asked for cannot be used on this runtime.
    #[error("dtype {dtype} is not supported by the {runtime} runtime{hint}")]
    UnsupportedDType {
        dtype: String,
        runtime: String,
        hint: String,
    },
    /// The model (directory or Hub repository) cannot be found or fetched.
    #[error("model '{spec}': {detail}")]
    ModelNotFound { spec: String, detail: String },
    /// Logits that cannot be sampled from (NaN, or no finite value).
    #[error("logits at step {step}: {detail}")]
    BadLogits { step: usize, detail: String },
    /// A kernel or device operation failed.
    #[error(transparent)]
    Ops(#[from] ops::OpsError),
    /// Building a block-sparse layer failed.
    #[error(transparent)]
    Sparse(#[from] sparse::SparseError),
    /// A part of the model that is not written yet.
    #[error("not implemented: {0}")]
    NotImplemented(&'static str),
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.into(),
            detail: err.to_string(),
        }
    }

    pub(crate) fn config(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self::Config {
            path: path.into(),
            field: field.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn param(name: &'static str, detail: impl Into<String>) -> Self {
        Self::InvalidParameter {
            name,
            detail: detail.into(),
        }
    }

    /// A short machine-readable kind, for tests and for callers that branch on the cause.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::Json { .. } => "json",
            Self::Config { .. } => "config",
            Self::UnsupportedArchitecture { .. } => "architecture",
            Self::Safetensors { .. } => "safetensors",
            Self::MissingTensor { .. } => "missing-tensor",
            Self::TensorShape { .. } => "tensor-shape",
            Self::TensorDType { .. } => "tensor-dtype",
            Self::TensorValue { .. } => "tensor-value",
            Self::Tokenizer(_) => "tokenizer",
            Self::ChatTemplate(_) => "chat-template",
            Self::InvalidParameter { .. } => "parameter",
            Self::ContextOverflow { .. } => "context-overflow",
            Self::DeviceMemory(_) => "device-memory",
            Self::UnsupportedDType { .. } => "dtype",
            Self::ModelNotFound { .. } => "model-not-found",
            Self::BadLogits { .. } => "logits",
            Self::Ops(_) => "ops",
            Self::Sparse(_) => "sparse",
            Self::NotImplemented(_) => "not-implemented",
        }
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Reads a JSON file into a `serde_json::Value`, with errors naming the file.
pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Json {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}
