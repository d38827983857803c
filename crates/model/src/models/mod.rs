//! The architectures, apart from the engine that runs them.
//!
//! A family (one file each: [`qwen2`], [`qwen3`], [`llama`]) is what distinguishes one
//! checkpoint layout from another and nothing else: which transformers classes and
//! `model_type` it answers to, how its `config.json` maps to [`ModelConfig`] (its fields, its
//! defaults as its transformers config class defines them, what it refuses), and how it
//! configures the pre-norm decoder block the three share ([`decoder`]: which tensors each layer
//! has by Hugging Face name, which are fused into one projection, and the one layer forward that
//! prefill and decode both run). The RoPE tables a family needs follow from its config
//! (`rope_theta`, [`ops::rope::RopeScaling`]).
//!
//! The engine ([`crate::engine`]) loads, caches, buffers, captures and generates for any of
//! them through [`ModelConfig`] and [`decoder::DecoderLayer`] alone: adding a family that runs
//! the same block is a config mapping and a registry entry.

pub mod decoder;
pub mod llama;
pub mod qwen2;
pub mod qwen3;

use crate::config::{Fields, ModelConfig};
use crate::error::{ModelError, Result};

/// One model family.
pub trait Architecture: Sync {
    /// The `model_type` of its `config.json`.
    fn model_type(&self) -> &'static str;
    /// The transformers classes it loads: the causal LM first, then the headless base model
    /// (whose checkpoints name tensors without the `model.` prefix and have no `lm_head`).
    fn classes(&self) -> &'static [&'static str];
    /// Maps `config.json` to the hyperparameters and the decoder block, with the family's
    /// defaults; errors name the field. `class` is the class found in `architectures`.
    fn config(&self, f: &Fields<'_>, class: &str) -> Result<ModelConfig>;
}

/// Every supported family.
pub static ARCHITECTURES: [&dyn Architecture; 3] = [&qwen2::Qwen2, &qwen3::Qwen3, &llama::Llama];

/// The family of a `model_type`.
pub fn by_model_type(model_type: &str) -> Option<&'static dyn Architecture> {
    ARCHITECTURES
        .iter()
        .copied()
        .find(|a| a.model_type() == model_type)
}

/// Every class name we load, for messages.
pub fn supported_classes() -> Vec<&'static str> {
    ARCHITECTURES
        .iter()
        .flat_map(|a| a.classes().iter().copied())
        .collect()
}

/// The family and class of a `config.json`: the first class of `architectures` that a family
/// loads, else the family of `model_type` (its causal LM class). A `model_type` that names
/// another family than the class is refused rather than trusted either way.
pub(crate) fn detect(f: &Fields<'_>) -> Result<(&'static dyn Architecture, String)> {
    let unsupported = |arch: String| ModelError::UnsupportedArchitecture {
        path: f.path().to_path_buf(),
        arch,
        supported: supported_classes().join(", "),
    };
    let model_type = f.str_opt("model_type")?;
    let (arch, class) = match f.get("architectures") {
        Some(serde_json::Value::Array(list)) if !list.is_empty() => {
            let names: Vec<&str> = list.iter().filter_map(|v| v.as_str()).collect();
            let found = names.iter().find_map(|n| {
                ARCHITECTURES
                    .iter()
                    .find(|a| a.classes().contains(n))
                    .map(|a| (*a, n.to_string()))
            });
            found.ok_or_else(|| unsupported(names.join(", ")))?
        }
        Some(serde_json::Value::Array(_)) | None => match model_type {
            Some(mt) => {
                let arch =
                    by_model_type(mt).ok_or_else(|| unsupported(format!("model_type {mt}")))?;
                (arch, arch.classes()[0].to_string())
            }
            None => {
                return Err(f.err(
                    "architectures",
                    "missing (and no model_type either): cannot tell the architecture",
                ))
            }
        },
        Some(v) => return Err(f.err("architectures", format!("expected a list, found {v}"))),
    };
    if let Some(mt) = model_type {
        if mt != arch.model_type() {
            return Err(unsupported(format!("{class} with model_type {mt}")));
        }
    }
    Ok((arch, class))
}
