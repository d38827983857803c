//! Qwen3 (dense): transformers' `Qwen3Config`, `Qwen3ForCausalLM` and the headless
//! `Qwen3Model`.
//!
//! The Qwen2 block without q/k/v biases but with an RMSNorm over each q head and each k head
//! (`self_attn.q_norm.weight`, `self_attn.k_norm.weight`, `[head_dim]`, eps `rms_norm_eps`)
//! before RoPE, which the fused QKV kernel applies in the same launch. `attention_bias` (default
//! false) adds biases to q, k, v and o.
//!
//! Config defaults where they matter (transformers' `Qwen3Config`): `head_dim` 128 when missing
//! (not `hidden_size / num_attention_heads`: the released models have wider heads than that),
//! `num_key_value_heads` 32 when missing (`num_attention_heads` when `null`),
//! `max_position_embeddings` 32768, no bos/eos ids, the sliding-window fields of Qwen2.
//!
//! Tensors of layer `i` (`model.layers.{i}.`): those of Qwen2 (q/k/v fused, gate/up fused)
//! without the q/k/v biases unless `attention_bias`, plus `self_attn.q_norm.weight` and
//! `self_attn.k_norm.weight`.

use super::decoder::DecoderBlock;
use super::Architecture;
use crate::config::{parse_common, FamilyDefaults, Fields, ModelConfig};
use crate::error::Result;

/// The Qwen3 family.
pub struct Qwen3;

const DEFAULTS: FamilyDefaults = FamilyDefaults {
    kv_heads: Some(32),
    head_dim: Some(128),
    max_position_embeddings: 32768,
    bos_token_id: None,
    eos_token_ids: &[],
    sliding_window: true,
};

impl Architecture for Qwen3 {
    fn model_type(&self) -> &'static str {
        "qwen3"
    }

    fn classes(&self) -> &'static [&'static str] {
        &["Qwen3ForCausalLM", "Qwen3Model"]
    }

    fn config(&self, f: &Fields<'_>, class: &str) -> Result<ModelConfig> {
        let bias = f.bool_or("attention_bias", false)?;
        let block = DecoderBlock {
            qkv_bias: bias,
            o_bias: bias,
            qk_norm: true,
        };
        parse_common(f, class, self.model_type(), &DEFAULTS, block)
    }
}
