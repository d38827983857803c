//! The activations of a forward pass and the context one layer runs in.
//!
//! Prefill and decode run the same layer forward ([`crate::models::decoder::DecoderLayer::forward`])
//! over a [`StepContext`]: prefill over [`Activations`] of `T` rows allocated for the call, the
//! decode step over the one-row activations of its [`DecodeBuffers`], allocated once with
//! everything else the step writes, so the step allocates nothing and can be captured as a CUDA
//! graph.

use cubecl::prelude::*;
use ops::attention::{AttentionWorkspace, KvLen};
use ops::qkv::HeadShape;
use ops::rope::RopeCache;
use ops::{DType, DeviceTensor};

use crate::config::ModelConfig;
use crate::engine::projection::ProjectionScratch;
use crate::engine::screen::ScreenBuffers;
use crate::error::{ModelError, Result};

/// The activations of `T` tokens through one layer, reused by every layer.
///
/// | buffer | shape | role |
/// |---|---|---|
/// | `hidden`, `hidden2` | `[T, H]` | residual stream (ping-pong) |
/// | `normed` | `[T, H]` | RMSNorm output fed to the projections |
/// | `qkv` | `[T, (Hq + 2 Hkv) D]` | fused q/k/v projection with biases |
/// | `q` | `[T, Hq, D]` | query after the norms and RoPE (k and v go straight to the cache) |
/// | `attn` (`attn_flat`) | `[T, Hq, D]` (`[T, Hq D]`) | attention output |
/// | `gate` | `[T, I]` | `silu(gate) * up` from the fused MLP kernel |
pub struct Activations<R: Runtime> {
    pub hidden: DeviceTensor<R>,
    pub hidden2: DeviceTensor<R>,
    pub normed: DeviceTensor<R>,
    pub qkv: DeviceTensor<R>,
    pub q: DeviceTensor<R>,
    pub attn: DeviceTensor<R>,
    pub attn_flat: DeviceTensor<R>,
    pub gate: DeviceTensor<R>,
}

impl<R: Runtime> Activations<R> {
    pub fn new(
        client: &ComputeClient<R>,
        config: &ModelConfig,
        dtype: DType,
        tokens: usize,
    ) -> Result<Self> {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let (hq, hkv, d) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        );
        let t = tokens;
        let attn = DeviceTensor::empty(client, &[t, hq, d], dtype);
        Ok(Self {
            hidden: DeviceTensor::empty(client, &[t, h], dtype),
            hidden2: DeviceTensor::empty(client, &[t, h], dtype),
            normed: DeviceTensor::empty(client, &[t, h], dtype),
            qkv: DeviceTensor::empty(client, &[t, (hq + 2 * hkv) * d], dtype),
            q: DeviceTensor::empty(client, &[t, hq, d], dtype),
            attn_flat: attn.reshape(&[t, hq * d])?,
            attn,
            gate: DeviceTensor::empty(client, &[t, i], dtype),
        })
    }

    /// Rows (tokens).
    pub fn tokens(&self) -> usize {
        self.hidden.shape()[0]
    }
}

/// The cache length the attention of a step sees (after the step's append).
pub enum CacheLen<'a, R: Runtime> {
    /// Known on the host (prefill): the attention kernels are planned for it.
    Host(usize),
    /// Read from the cache's device copy when the kernels run (the captured decode step).
    Device(&'a DeviceTensor<R>),
}

impl<R: Runtime> Clone for CacheLen<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for CacheLen<'_, R> {}

impl<'a, R: Runtime> CacheLen<'a, R> {
    pub fn as_kv_len(self) -> KvLen<'a, R> {
        match self {
            Self::Host(n) => KvLen::Host(n),
            Self::Device(t) => KvLen::Device(t),
        }
    }

    /// The length for an attention launched right after the cache append that wrote the newest
    /// rows: [`KvLen::Appended`] where it is on the device (the older rows were written by
    /// earlier steps).
    pub fn after_append(self) -> KvLen<'a, R> {
        match self {
            Self::Host(n) => KvLen::Host(n),
            Self::Device(t) => KvLen::Appended(t),
        }
    }
}

/// Everything one layer forward reads besides the layer's weights and its cache.
pub struct StepContext<'a, R: Runtime> {
    pub client: &'a ComputeClient<R>,
    pub act: &'a Activations<R>,
    /// `u32[1]`: the position of the first token (RoPE row and cache row).
    pub start: &'a DeviceTensor<R>,
    pub kv_len: CacheLen<'a, R>,
    /// A ragged batch instead of one sequence: `u32[B, 2]`, row `b`'s `(position, slot)` in a
    /// slot cache (`start` and `kv_len` are then unused).
    pub ragged: Option<&'a DeviceTensor<R>>,
    pub rope: &'a RopeCache<R>,
    pub heads: HeadShape,
    pub eps: f32,
    /// The attention scale `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// Split-KV attention partials (the decode step's; prefill allocates per call).
    pub workspace: Option<&'a AttentionWorkspace<R>>,
    /// Intermediates of compressed projections, sized for one token (decode only).
    pub scratch: Option<&'a ProjectionScratch<R>>,
}

/// Everything one decode step reads and writes besides the weights and the KV cache,
/// allocated once so the step allocates nothing and can be captured as a CUDA graph. The
/// token's position and the cache length come from the cache ([`crate::KvCache::start`],
/// [`crate::KvCache::end`]).
///
/// | buffer | shape | dtype | role |
/// |---|---|---|---|
/// | `token` | `[1]` | u32 | the input token id (host-written) |
/// | `act` | `[1, ..]` | compute | the layer activations ([`Activations`]; `normed` also takes the final norm) |
/// | `logits` | `[1, V]` | compute | output of the LM head |
/// | `next_token` | `[1]` | u32 | device argmax of `logits` (greedy without reading the logits; sampled steps use the session's device sampler) |
/// | `chosen` | 2 x `[1]` | u32 | `next_token` again, in slot `len % 2` (`len`: the cache length after the step), so that the host reads a step's id while the next step writes the other slot |
/// | `workspace` | | f32 | split-KV attention partials, sized for the cache's capacity |
/// | `scratch` | | compute | intermediates of compressed projections |
/// | `screen` | `[1, V]` + scratch | compute | the screened LM head's approximate logits (models that screen it; the screened step leaves `logits` unwritten) |
pub struct DecodeBuffers<R: Runtime> {
    pub dtype: DType,
    pub token: DeviceTensor<R>,
    pub act: Activations<R>,
    pub logits: DeviceTensor<R>,
    pub next_token: DeviceTensor<R>,
    pub chosen: [DeviceTensor<R>; 2],
    pub workspace: AttentionWorkspace<R>,
    pub scratch: ProjectionScratch<R>,
    /// The screened LM head's approximate logits and scratch (models that screen it).
    pub screen: Option<ScreenBuffers<R>>,
}

impl<R: Runtime> DecodeBuffers<R> {
    pub fn new(
        client: &ComputeClient<R>,
        config: &ModelConfig,
        dtype: DType,
        max_len: usize,
    ) -> Result<Self> {
        let (hq, hkv, d) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        );
        let scalar = || DeviceTensor::from_slice(client, &[0u32], &[1]);
        Ok(Self {
            dtype,
            token: scalar()?,
            act: Activations::new(client, config, dtype, 1)?,
            logits: DeviceTensor::empty(client, &[1, config.vocab_size], dtype),
            next_token: scalar()?,
            chosen: [scalar()?, scalar()?],
            workspace: AttentionWorkspace::for_shapes(client, 1, hq, hkv, d, max_len),
            scratch: ProjectionScratch::new(client, config, dtype),
            screen: None,
        })
    }

    /// Writes the step's input token (host to device, outside any capture window).
    pub fn write_token(&self, client: &ComputeClient<R>, token: u32) -> Result<()> {
        self.token.write_bytes(client, &token.to_le_bytes())?;
        Ok(())
    }

    pub(crate) fn check_dtype(&self, dtype: DType) -> Result<()> {
        check_buffers_dtype("decode_step", self.dtype, dtype)
    }
}

/// Errors unless a step's buffers (`have`) are in the model's compute dtype (`want`).
pub(crate) fn check_buffers_dtype(op: &'static str, have: DType, want: DType) -> Result<()> {
    if have != want {
        return Err(ModelError::param(
            op,
            format!("the buffers are {have}, the model computes in {want}"),
        ));
    }
    Ok(())
}
