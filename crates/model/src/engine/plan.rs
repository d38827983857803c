//! The host-side half of loading: every tensor a config implies, checked in the checkpoint
//! (presence, shape, float dtype) before anything is uploaded, and grouped into the device
//! tensors the model holds (fused projections by name, see
//! [`crate::models::decoder::DecoderBlock::uploads`]). Tests run it without a device.

use ops::DType;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::models::decoder::{Role, TensorSpec};
use crate::weights::WeightStore;

/// Where an upload goes in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Embedding,
    Layer(usize, Role),
    FinalNorm,
    LmHead,
}

/// One device tensor: checkpoint tensors concatenated along their first dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedUpload {
    pub target: Target,
    pub parts: Vec<TensorSpec>,
}

impl PlannedUpload {
    /// The shape of the concatenation.
    pub fn shape(&self) -> Vec<usize> {
        let mut shape = self.parts[0].shape.clone();
        shape[0] = self.parts.iter().map(|p| p.shape[0]).sum();
        shape
    }

    /// The parts' names joined with ` + ` (for progress and error messages).
    pub fn name(&self) -> String {
        let names: Vec<&str> = self.parts.iter().map(|p| p.name.as_str()).collect();
        names.join(" + ")
    }
}

/// What [`plan_weights`] found: the uploads, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightPlan {
    /// `"model."` for causal-LM checkpoints, `""` for headless base-model ones.
    pub prefix: String,
    /// embed_tokens, the layers' uploads, norm, then lm_head unless the embeddings are tied.
    pub uploads: Vec<PlannedUpload>,
    pub tied: bool,
    /// The dtype of the embedding table (the checkpoint's effective dtype).
    pub checkpoint_dtype: DType,
    /// Bytes of all planned tensors as stored.
    pub bytes: u64,
    /// Tensors of the checkpoint that the model does not use (rotary `inv_freq` buffers and a
    /// tied `lm_head.weight` are not listed).
    pub unused: Vec<String>,
}

impl WeightPlan {
    /// Every checkpoint tensor of the plan, in upload order.
    pub fn specs(&self) -> Vec<&TensorSpec> {
        self.uploads.iter().flat_map(|u| &u.parts).collect()
    }
}

/// Checks every tensor the config implies (presence, shape, dtype) on the host.
pub fn plan_weights(config: &ModelConfig, store: &WeightStore) -> Result<WeightPlan> {
    let prefix = if store.contains("model.embed_tokens.weight") {
        "model."
    } else if store.contains("embed_tokens.weight") {
        ""
    } else {
        return Err(ModelError::MissingTensor {
            name: "model.embed_tokens.weight".into(),
            path: store.source().to_path_buf(),
        });
    };
    let (h, v) = (config.hidden_size, config.vocab_size);
    let single = |target, name: String, shape: Vec<usize>| PlannedUpload {
        target,
        parts: vec![TensorSpec { name, shape }],
    };
    let tied = config.tie_word_embeddings;
    if !tied && prefix.is_empty() && !store.contains("lm_head.weight") {
        return Err(ModelError::config(
            crate::config::config_path(store.dir()),
            "tie_word_embeddings",
            format!(
                "false, but this headless {} checkpoint has no lm_head.weight to produce logits",
                config.architecture
            ),
        ));
    }
    // Each upload is checked as it is planned, so that a num_hidden_layers beyond the checkpoint
    // fails at its first missing layer instead of planning (and allocating) every layer first.
    let mut uploads = Vec::new();
    let mut bytes = 0u64;
    let mut checkpoint_dtype = None;
    let mut add = |upload: PlannedUpload| -> Result<()> {
        for spec in &upload.parts {
            let t = store.expect(&spec.name, &spec.shape)?;
            checkpoint_dtype.get_or_insert(t.dtype);
            bytes += t.byte_len() as u64;
        }
        uploads.push(upload);
        Ok(())
    };
    add(single(
        Target::Embedding,
        format!("{prefix}embed_tokens.weight"),
        vec![v, h],
    ))?;
    for i in 0..config.num_hidden_layers {
        for u in config.block.uploads(config, prefix, i) {
            add(PlannedUpload {
                target: Target::Layer(i, u.role),
                parts: u.parts,
            })?;
        }
    }
    add(single(
        Target::FinalNorm,
        format!("{prefix}norm.weight"),
        vec![h],
    ))?;
    if !tied {
        add(single(Target::LmHead, "lm_head.weight".into(), vec![v, h]))?;
    }
    let checkpoint_dtype = checkpoint_dtype.unwrap_or(DType::F32);
    let planned: std::collections::HashSet<&str> = uploads
        .iter()
        .flat_map(|u| u.parts.iter().map(|p| p.name.as_str()))
        .collect();
    let unused = store
        .names()
        .into_iter()
        .filter(|n| !planned.contains(n))
        .filter(|n| !(n.ends_with("rotary_emb.inv_freq") || (tied && *n == "lm_head.weight")))
        .map(str::to_string)
        .collect();
    Ok(WeightPlan {
        prefix: prefix.to_string(),
        uploads,
        tied,
        checkpoint_dtype,
        bytes,
        unused,
    })
}
