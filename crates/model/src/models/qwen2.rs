//! Qwen2 and Qwen2.5 (also DeepSeek-R1-Distill-Qwen): transformers' `Qwen2Config`,
//! `Qwen2ForCausalLM` and the headless `Qwen2Model`.
//!
//! Config defaults where they matter (transformers' `Qwen2Config`): `num_key_value_heads` 32
//! when the field is missing (`num_attention_heads` when `null`), `head_dim` =
//! `hidden_size / num_attention_heads` unless given, `max_position_embeddings` 32768, no bos/eos
//! ids, and the sliding-window fields (see [`crate::config`]).
//!
//! Tensors of layer `i` (`model.layers.{i}.`): `input_layernorm.weight [H]`,
//! `self_attn.{q,k,v}_proj.weight` `[Hq·D | Hkv·D | Hkv·D, H]` with their biases (always present),
//! fused into one QKV projection; `self_attn.o_proj.weight [H, Hq·D]` without bias;
//! `post_attention_layernorm.weight [H]`; `mlp.{gate,up}_proj.weight [I, H]` fused into one;
//! `mlp.down_proj.weight [H, I]`. The shared block of [`super::decoder`] runs them.

use super::decoder::DecoderBlock;
use super::Architecture;
use crate::config::{parse_common, FamilyDefaults, Fields, ModelConfig};
use crate::error::Result;

/// The Qwen2 family.
pub struct Qwen2;

/// q/k/v biases, no o bias, no q/k norms.
pub const BLOCK: DecoderBlock = DecoderBlock {
    qkv_bias: true,
    o_bias: false,
    qk_norm: false,
};

const DEFAULTS: FamilyDefaults = FamilyDefaults {
    kv_heads: Some(32),
    head_dim: None,
    max_position_embeddings: 32768,
    bos_token_id: None,
    eos_token_ids: &[],
    sliding_window: true,
};

impl Architecture for Qwen2 {
    fn model_type(&self) -> &'static str {
        "qwen2"
    }

    fn classes(&self) -> &'static [&'static str] {
        &["Qwen2ForCausalLM", "Qwen2Model"]
    }

    fn config(&self, f: &Fields<'_>, class: &str) -> Result<ModelConfig> {
        parse_common(f, class, self.model_type(), &DEFAULTS, BLOCK)
    }
}
