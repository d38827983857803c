//! The pre-norm decoder block that Qwen2, Qwen3 and Llama share, written once: its tensors by
//! Hugging Face name and how they are fused ([`DecoderBlock::uploads`]), the layer's device
//! weights ([`DecoderLayer`]), and the one layer forward ([`DecoderLayer::forward`]) that prefill
//! and decode both run over a [`StepContext`].
//!
//! Per layer, for `T` tokens at positions `start..start + T` (what transformers computes, with
//! the projections that read the same input fused):
//!
//! ```text
//! h   = rms_norm(x, input_layernorm, eps)                          [T, H]   (fused into qkv)
//! qkv = linear(h, q_proj | k_proj | v_proj (+ biases))              [T, (Hq + 2 Hkv) D]
//! q, k = per-head rms_norm(q, q_norm), rms_norm(k, k_norm)           (Qwen3 only)
//! q, k = rope(q, start + t), rope(k, start + t); cache[start + t] = k, v      (one launch)
//! a   = attention_cached(q, cache.k, cache.v, kv_len, 1/sqrt(D), causal)
//!       (one token without q/k norms on CUDA: one launch with the line above)
//! x   = linear(a, o_proj (+ bias), residual = x)
//! h   = rms_norm(x, post_attention_layernorm, eps)                           (fused into gate-up)
//! x   = linear(silu(h · gate_projᵀ) * (h · up_projᵀ), down_proj, residual = x)
//! ```
//!
//! The families configure the block with a [`DecoderBlock`]: Qwen2 has q/k/v biases and no o
//! bias; Qwen3 has q/k norms and biases on q/k/v/o when `attention_bias` says so; Llama has
//! biases on q/k/v/o when `attention_bias` says so.

use cubecl::prelude::*;
use ops::attention::{attention_decode_ragged_into, rope_attention_decode_into};
use ops::matmul::InputNorm;
use ops::qkv::{qkv_rope_cache_ragged_into, QkNorm};

use crate::config::ModelConfig;
use crate::engine::buffers::StepContext;
use crate::engine::kv_cache::LayerCache;
use crate::engine::projection::{Projection, Weight};
use crate::error::Result;

/// What a family's layers hold besides the shared block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecoderBlock {
    /// Biases on `q_proj`, `k_proj` and `v_proj` (fused like the weights).
    pub qkv_bias: bool,
    /// A bias on `o_proj`.
    pub o_bias: bool,
    /// RMSNorm weights `[head_dim]` applied to each q head and each k head before RoPE
    /// (`self_attn.q_norm`, `self_attn.k_norm`).
    pub qk_norm: bool,
}

/// What one device tensor of a layer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    InputNorm,
    Qkv,
    QkvBias,
    QNorm,
    KNorm,
    O,
    OBias,
    PostNorm,
    GateUp,
    Down,
}

/// Which part of the block a [`Role`] belongs to (what weight compression may apply to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleKind {
    /// Norm weights: always dense.
    Norm,
    /// The attention projections (q/k/v, o) and their biases.
    Attention,
    /// The MLP projections (gate/up, down).
    Mlp,
}

impl Role {
    pub fn kind(self) -> RoleKind {
        match self {
            Self::InputNorm | Self::QNorm | Self::KNorm | Self::PostNorm => RoleKind::Norm,
            Self::Qkv | Self::QkvBias | Self::O | Self::OBias => RoleKind::Attention,
            Self::GateUp | Self::Down => RoleKind::Mlp,
        }
    }
}

/// A checkpoint tensor: its Hugging Face name and the shape `config.json` implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

/// One device tensor of a layer: checkpoint tensors, by name, concatenated along their first
/// dimension (several for the fused projections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerUpload {
    pub role: Role,
    pub parts: Vec<TensorSpec>,
}

/// The projections that read the same input, fused into one: their names under `self_attn.` /
/// `mlp.`, in the order their rows are stacked.
pub const FUSED_QKV: [&str; 3] = ["q_proj", "k_proj", "v_proj"];
pub const FUSED_GATE_UP: [&str; 2] = ["gate_proj", "up_proj"];

impl DecoderBlock {
    /// The tensors of layer `i` (names under `{prefix}layers.{i}.`), grouped into device tensors,
    /// in upload order.
    pub fn uploads(&self, config: &ModelConfig, prefix: &str, i: usize) -> Vec<LayerUpload> {
        let (h, im, d) = (
            config.hidden_size,
            config.intermediate_size,
            config.head_dim,
        );
        let (q, kv) = (config.q_dim(), config.kv_dim());
        let layer = format!("{prefix}layers.{i}.");
        let spec = |name: String, shape: Vec<usize>| TensorSpec {
            name: format!("{layer}{name}"),
            shape,
        };
        let one = |role, name: &str, shape: Vec<usize>| LayerUpload {
            role,
            parts: vec![spec(name.to_string(), shape)],
        };
        let qkv_rows = [q, kv, kv];
        let qkv = |suffix: &str, with_k: bool| {
            FUSED_QKV
                .iter()
                .zip(qkv_rows)
                .map(|(p, rows)| {
                    let shape = if with_k { vec![rows, h] } else { vec![rows] };
                    spec(format!("self_attn.{p}.{suffix}"), shape)
                })
                .collect()
        };
        let mut uploads = vec![
            one(Role::InputNorm, "input_layernorm.weight", vec![h]),
            LayerUpload {
                role: Role::Qkv,
                parts: qkv("weight", true),
            },
        ];
        if self.qkv_bias {
            uploads.push(LayerUpload {
                role: Role::QkvBias,
                parts: qkv("bias", false),
            });
        }
        if self.qk_norm {
            uploads.push(one(Role::QNorm, "self_attn.q_norm.weight", vec![d]));
            uploads.push(one(Role::KNorm, "self_attn.k_norm.weight", vec![d]));
        }
        uploads.push(one(Role::O, "self_attn.o_proj.weight", vec![h, q]));
        if self.o_bias {
            uploads.push(one(Role::OBias, "self_attn.o_proj.bias", vec![h]));
        }
        uploads.push(one(
            Role::PostNorm,
            "post_attention_layernorm.weight",
            vec![h],
        ));
        uploads.push(LayerUpload {
            role: Role::GateUp,
            parts: FUSED_GATE_UP
                .iter()
                .map(|p| spec(format!("mlp.{p}.weight"), vec![im, h]))
                .collect(),
        });
        uploads.push(one(Role::Down, "mlp.down_proj.weight", vec![h, im]));
        uploads
    }
}

/// The RMSNorm of a pre-norm block's input, for the projection that consumes it.
fn input_norm<R: Runtime>(w: &Weight<R>, eps: f32) -> InputNorm<'_, R> {
    InputNorm {
        weight: &w.tensor,
        eps,
    }
}

/// What the loader hands a layer under construction: its uploads, by role.
pub trait LayerParts<R: Runtime> {
    /// The dense upload of `role` (norm weights), `None` when the block has none.
    fn weight(&mut self, role: Role) -> Result<Option<Weight<R>>>;
    /// The projection of `weight`, with the bias of `bias` when the block has one.
    fn projection(&mut self, weight: Role, bias: Option<Role>) -> Result<Projection<R>>;
}

/// One decoder layer on the device, in the compute dtype. Linear weights are `[out, in]` as in
/// the checkpoint; the projections that read the same input are concatenated at load (on the
/// host, so nothing is stored twice): one GEMV/GEMM instead of three (q, k, v) or two (gate,
/// up).
#[derive(Debug)]
pub struct DecoderLayer<R: Runtime> {
    pub input_layernorm: Weight<R>,
    /// `[Hq·D + 2·Hkv·D, H]`: `q_proj`, `k_proj`, `v_proj` rows, with their biases if any.
    pub qkv_proj: Projection<R>,
    /// `[D]` each: the per-head norms of q and k, when the block has them.
    pub q_norm: Option<Weight<R>>,
    pub k_norm: Option<Weight<R>>,
    pub o_proj: Projection<R>,
    pub post_attention_layernorm: Weight<R>,
    /// `[2·I, H]`: `gate_proj` rows, then `up_proj` rows.
    pub gate_up_proj: Projection<R>,
    pub down_proj: Projection<R>,
}

impl<R: Runtime> DecoderLayer<R> {
    /// Builds the layer from its uploads (in the order of [`DecoderBlock::uploads`]).
    pub fn assemble(parts: &mut dyn LayerParts<R>) -> Result<Self> {
        let required = |w: Option<Weight<R>>, role: Role| {
            w.ok_or_else(|| crate::ModelError::param("layer", format!("no {role:?} upload")))
        };
        let input_layernorm = required(parts.weight(Role::InputNorm)?, Role::InputNorm)?;
        let qkv_proj = parts.projection(Role::Qkv, Some(Role::QkvBias))?;
        let q_norm = parts.weight(Role::QNorm)?;
        let k_norm = parts.weight(Role::KNorm)?;
        let o_proj = parts.projection(Role::O, Some(Role::OBias))?;
        let post_attention_layernorm = required(parts.weight(Role::PostNorm)?, Role::PostNorm)?;
        Ok(Self {
            input_layernorm,
            qkv_proj,
            q_norm,
            k_norm,
            o_proj,
            post_attention_layernorm,
            gate_up_proj: parts.projection(Role::GateUp, None)?,
            down_proj: parts.projection(Role::Down, None)?,
        })
    }

    /// The layer's projections: qkv, o, gate-up, down.
    pub fn projections(&self) -> [&Projection<R>; 4] {
        [
            &self.qkv_proj,
            &self.o_proj,
            &self.gate_up_proj,
            &self.down_proj,
        ]
    }

    /// Every dense upload of the layer, in upload order (compressed projections hold none).
    pub fn dense_weights(&self) -> Vec<&Weight<R>> {
        let mut all = vec![&self.input_layernorm];
        all.extend(self.qkv_proj.dense_weights());
        all.extend(self.q_norm.iter().chain(&self.k_norm));
        all.extend(self.o_proj.dense_weights());
        all.push(&self.post_attention_layernorm);
        all.extend(self.gate_up_proj.dense_weights());
        all.extend(self.down_proj.dense_weights());
        all
    }

    /// The layer over `s` (see the module docs): reads the residual stream from
    /// `s.act.hidden`, appends the tokens' keys and values to `cache` at `s.start` (in a ragged
    /// batch, each row's at its own position and slot of a `[slots, max_len, Hkv, D]` cache),
    /// and leaves
    /// the new residual stream in `s.act.hidden`. Writes only into `s`'s buffers and the cache,
    /// so a decode step made of these calls can be captured as a CUDA graph.
    pub fn forward(&self, s: &StepContext<'_, R>, cache: &LayerCache<R>) -> Result<()> {
        let (c, a) = (s.client, s.act);
        self.qkv_proj.forward_normed_into(
            c,
            &a.hidden,
            input_norm(&self.input_layernorm, s.eps),
            &a.normed,
            &a.qkv,
            s.scratch,
        )?;
        let qk_norm = match (&self.q_norm, &self.k_norm) {
            (Some(q), Some(k)) => Some(QkNorm {
                q_weight: &q.tensor,
                k_weight: &k.tensor,
                eps: s.eps,
            }),
            _ => None,
        };
        match s.ragged {
            None => {
                rope_attention_decode_into(
                    c,
                    &a.qkv,
                    s.heads,
                    &s.rope.cos,
                    &s.rope.sin,
                    s.start,
                    &cache.k,
                    &cache.v,
                    qk_norm,
                    s.kv_len.after_append(),
                    s.scale,
                    &a.q,
                    &a.attn,
                    s.workspace,
                )?;
            }
            Some(seqs) => {
                qkv_rope_cache_ragged_into(
                    c,
                    &a.qkv,
                    s.heads,
                    &s.rope.cos,
                    &s.rope.sin,
                    seqs,
                    &a.q,
                    &cache.k,
                    &cache.v,
                    qk_norm,
                )?;
                attention_decode_ragged_into(
                    c,
                    &a.q,
                    &cache.k,
                    &cache.v,
                    seqs,
                    s.scale,
                    &a.attn,
                    s.workspace,
                )?;
            }
        }
        // The residual stream ping-pongs between `hidden` and `hidden2`: an output may not
        // alias an input of the same launch (WebGPU forbids it).
        self.o_proj
            .forward_into(c, &a.attn_flat, Some(&a.hidden), &a.hidden2, s.scratch)?;
        self.gate_up_proj.gated_mlp_normed_into(
            c,
            &a.hidden2,
            input_norm(&self.post_attention_layernorm, s.eps),
            &a.normed,
            &a.gate,
            s.scratch,
        )?;
        self.down_proj
            .forward_into(c, &a.gate, Some(&a.hidden2), &a.hidden, s.scratch)?;
        Ok(())
    }
}
