//! Llama (2, 3, 3.1, 3.2 and the many checkpoints in its layout): transformers' `LlamaConfig`,
//! `LlamaForCausalLM` and the headless `LlamaModel`.
//!
//! The shared pre-norm block; `attention_bias` (default false) adds biases to q, k, v and o.
//! `mlp_bias: true` (biases on gate, up and down) is refused: the fused gated-MLP kernels have
//! no bias epilogue. Llama 3.1+ scale RoPE with `rope_type: "llama3"` (see [`crate::config`]).
//!
//! Config defaults where they matter (transformers' `LlamaConfig`): `num_key_value_heads` =
//! `num_attention_heads`, `head_dim` = `hidden_size / num_attention_heads` (and, as transformers
//! checks, `hidden_size` must be a multiple of `num_attention_heads` even when `head_dim` is
//! given), `max_position_embeddings` 2048, `bos_token_id` 1 and `eos_token_id` 2 when the
//! fields are missing. `pretraining_tp` only splits transformers' matmuls into slices that sum
//! to the same product and is ignored.
//!
//! Tensors of layer `i` (`model.layers.{i}.`): `input_layernorm.weight`,
//! `self_attn.{q,k,v}_proj.weight` fused (with `.bias` when `attention_bias`),
//! `self_attn.o_proj.weight` (+ `.bias`), `post_attention_layernorm.weight`,
//! `mlp.{gate,up}_proj.weight` fused, `mlp.down_proj.weight`.

use super::decoder::DecoderBlock;
use super::Architecture;
use crate::config::{parse_common, FamilyDefaults, Fields, ModelConfig};
use crate::error::Result;

/// The Llama family.
pub struct Llama;

const DEFAULTS: FamilyDefaults = FamilyDefaults {
    kv_heads: None,
    head_dim: None,
    max_position_embeddings: 2048,
    bos_token_id: Some(1),
    eos_token_ids: &[2],
    sliding_window: false,
};

impl Architecture for Llama {
    fn model_type(&self) -> &'static str {
        "llama"
    }

    fn classes(&self) -> &'static [&'static str] {
        &["LlamaForCausalLM", "LlamaModel"]
    }

    fn config(&self, f: &Fields<'_>, class: &str) -> Result<ModelConfig> {
        if f.bool_or("mlp_bias", false)? {
            return Err(f.err(
                "mlp_bias",
                "true is not supported (biases on gate_proj, up_proj and down_proj)",
            ));
        }
        let bias = f.bool_or("attention_bias", false)?;
        let block = DecoderBlock {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: false,
        };
        let config = parse_common(f, class, self.model_type(), &DEFAULTS, block)?;
        if config.hidden_size % config.num_attention_heads != 0 {
            return Err(f.err(
                "hidden_size",
                format!(
                    "{} is not a multiple of num_attention_heads {}",
                    config.hidden_size, config.num_attention_heads
                ),
            ));
        }
        Ok(config)
    }
}
