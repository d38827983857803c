//! Scaled dot-product attention with grouped-query heads: prefill (many queries), decode (a few
//! queries against a long cache) and the KV-cache write.
//!
//! Layouts are the model's natural ones, no transposes: `q[Lq, Hq, D]`, `k`/`v` `[Lk, Hkv, D]`,
//! `out[Lq, Hq, D]`, all contiguous. Query head `h` reads KV head `h / (Hq / Hkv)` by indexing
//! (never by copying K/V). With `causal`, query `i` sees key `j` iff `j <= i + Lk - Lq`, which is
//! the usual lower triangle when `Lq == Lk` and "prefill appended to a cache" when `Lq < Lk`.
//!
//! **Batching.** [`attention`] and [`attention_into`] also accept a leading batch dimension on all
//! of `q`, `k`, `v` and `out` (`[B, Lq, Hq, D]` with `[B, Lk, Hkv, D]`): the sequences are
//! independent and have equal lengths. [`attention_cached_into`] serves one sequence (one cache);
//! [`attention_decode_ragged_into`] serves one query each of a batch of sequences of different
//! lengths, each in its own slot of a shared cache (continuous batching's decode step).
//!
//! **Numerics.** Inputs f32, f16 or bf16 (not bf16 on wgpu); scores, softmax statistics and
//! accumulators in f32 ([`crate::online_softmax`]); the output rounded once to the input dtype.
//!
//! **Kernels** (one file each; [`AttentionStrategy::Auto`] picks, `plan.rs` says how):
//! - more than [`DECODE_MAX_QUERIES`] queries, f16/bf16 on a runtime with tensor-core `mma`
//!   (CUDA sm80+), head dim a multiple of 16 up to 128: `flash.rs`, FlashAttention-2 on tensor
//!   cores;
//! - up to [`DECODE_MAX_QUERIES`] queries: split-KV flash-decoding, on tensor cores under the same
//!   conditions as prefill (`split_kv_mma.rs`: the query heads of a KV head packed into one 16-row
//!   tile), else with plane shuffles where the runtime has plane operations (`split_kv.rs`);
//! - anything else (wgpu without plane ops, f32, other head dims): the portable tiled
//!   flash-attention kernel (`tiled.rs`), which also splits long key ranges.
//!
//! The two tensor-core kernels run the same FlashAttention step (`flash_step.rs`: S = Q·Kᵀ with
//! `mma`, the online-softmax update on `ex2`, P repacked in registers, O += P·V); split launches
//! end with `merge.rs`, which combines the per-split partials. On GPUs with thread-block clusters
//! (CUDA sm_90+), a tensor-core decode whose keys fit 8 cubes of one tile each runs on clusters of
//! those 8 cubes, which merge their partials themselves through distributed shared memory
//! (`cluster_merge.rs`): no merge kernel. A longer tensor-core decode whose cubes all fit the GPU
//! at once, each streaming at least 256 keys, and that is given an [`AttentionWorkspace`] merges
//! its partials itself too: its cubes count themselves done on a workspace counter, and once the
//! count is complete the cubes of the first splits merge one row each (`merge.rs`'s row merge, in
//! the decode kernel). With fewer keys a cube the merge kernel is faster.
//!
//! **Tuning.** The tensor-core tile shapes are the caller's: [`AttentionStrategy::Auto`] uses
//! [`FlashTiling::default`] and [`SplitKvTiling::default`] (measured best on an H100; for a
//! clustered decode, 8 planes on 128-key tiles, also measured best there; where 128-key tiles
//! still give every SM a cube, as at long contexts, 4 planes on 128-key tiles, measured best in
//! the model's decode step on an H200), and a forced
//! [`AttentionStrategy::TensorCore`] / [`AttentionStrategy::TensorCoreDecode`] carries its own
//! (benchmark sweeps pass theirs this way).
//!
//! **Workspace.** When the keys are split, the partials live in a small f32 workspace
//! (`splits x Lq x Hq x (D + 2)`). [`attention_into`] allocates it per call;
//! [`attention_cached_into`] uses the [`AttentionWorkspace`] it is given (an
//! [`OpsError::InvalidArgument`] if too small; `None` allocates per call). The model's decode step
//! passes one, so that it allocates nothing and can be captured as a CUDA graph.

mod cluster_merge;
mod flash;
mod flash_step;
mod geometry;
mod kv_cache;
mod merge;
mod plan;
mod rope_decode;
mod split_kv;
mod split_kv_mma;
mod tiled;
mod validate;
mod workspace;

pub use kv_cache::kv_cache_write_into;
pub use plan::clustered_decode_keys;
pub use rope_decode::rope_attention_decode_into;
pub use workspace::AttentionWorkspace;

use cubecl::prelude::*;

use crate::{DeviceTensor, OpsError, Result};
use plan::Problem;

/// The largest head dimension the kernels accept.
pub const MAX_HEAD_DIM: usize = 256;

/// Up to this many queries, attention runs as flash-decoding (keys split across cubes, every
/// query of the group sharing the K/V reads); above it, as prefill (queries tiled across cubes).
pub const DECODE_MAX_QUERIES: usize = 8;

/// The current length of a KV cache (or the start row of a cache write).
pub enum KvLen<'a, R: Runtime> {
    /// Known on the host: validated before launch.
    Host(usize),
    /// A `u32` tensor of shape `[1]` on the device, read by the kernel: the length can change
    /// between replays of a captured CUDA graph. The host cannot validate it; the kernels clamp
    /// it to the cache size.
    Device(&'a DeviceTensor<R>),
    /// [`KvLen::Device`], where the caller also guarantees that the kernel launched just before
    /// this call (the cache append) writes the newest `Lq` rows and nothing else of the cache,
    /// and that the older rows and the length were written before that kernel started. On CUDA
    /// with programmatic dependent launch the decode kernel then loads its first keys while
    /// that kernel finishes. Elsewhere it is [`KvLen::Device`].
    Appended(&'a DeviceTensor<R>),
}

impl<'a, R: Runtime> KvLen<'a, R> {
    /// The device tensor of [`KvLen::Device`] and [`KvLen::Appended`].
    pub fn device(self) -> Option<&'a DeviceTensor<R>> {
        match self {
            Self::Host(_) => None,
            Self::Device(t) | Self::Appended(t) => Some(t),
        }
    }
}

impl<R: Runtime> Clone for KvLen<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for KvLen<'_, R> {}

/// Which kernel runs. [`AttentionStrategy::Auto`] is what the model uses; the others exist so that
/// tests and benchmarks can exercise each kernel on any runtime that supports it (an unsupported
/// choice is an [`OpsError::UnsupportedFeature`], invalid tile values an
/// [`OpsError::InvalidArgument`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionStrategy {
    /// The fastest kernel the runtime has for the problem, with the default tile shapes.
    #[default]
    Auto,
    /// The portable shared-memory kernel (any runtime, any float dtype).
    Tiled,
    /// FlashAttention-2 on tensor cores (CUDA `mma`, f16/bf16, D % 16 == 0, D <= 128, scale > 0).
    TensorCore(FlashTiling),
    /// Split-KV flash-decoding with plane shuffles (needs plane operations).
    Decode,
    /// Split-KV flash-decoding on tensor cores (same requirements as `TensorCore`).
    TensorCoreDecode(SplitKvTiling),
}

/// The tile shape of the tensor-core prefill kernel: `16 * warps` query rows and `bk` keys per
/// tile. `warps` is 1, 2, 4 or 8; `bk` a multiple of 16 in `16..=128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashTiling {
    /// Planes per cube; each owns 16 query rows.
    pub warps: usize,
    /// Keys per K/V tile.
    pub bk: usize,
}

impl Default for FlashTiling {
    /// 4 planes of 16 query rows and 64-key tiles, measured best on an H100.
    fn default() -> Self {
        Self { warps: 4, bk: 64 }
    }
}

/// The tile shape and key split of the tensor-core decode kernel: `bk` keys per tile shared by
/// `warps` planes (`bk` a multiple of `16 * warps`, at most 128; `warps` 1, 2, 4 or 8), and about
/// `cubes_per_sm` cubes per SM (1 to 8) over the whole problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitKvTiling {
    /// Planes per cube; each takes `bk / warps` keys of every tile.
    pub warps: usize,
    /// Keys per K/V tile.
    pub bk: usize,
    /// Cubes per SM the key split aims for. [`AttentionWorkspace::for_shapes`] has room for 2;
    /// more needs a workspace sized with [`AttentionWorkspace::new`].
    pub cubes_per_sm: usize,
}

impl Default for SplitKvTiling {
    /// One cube per SM measured best at L = 32768 on the H100 (18.3 µs graph-replayed against
    /// 20.1 µs with two): fewer, longer cubes pay the pipeline prologue and the cross-plane merge
    /// less often.
    fn default() -> Self {
        Self {
            warps: 4,
            bk: 64,
            cubes_per_sm: 1,
        }
    }
}

/// `softmax(q·kᵀ·scale [+ causal mask])·v`; see the module docs for shapes and the causal rule.
pub fn attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    scale: f32,
    causal: bool,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, q.shape(), q.dtype());
    attention_into(client, q, k, v, scale, causal, &out)?;
    Ok(out)
}

/// [`attention`] into a preallocated `out` with the shape and dtype of `q` (which it may not
/// alias).
pub fn attention_into<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    scale: f32,
    causal: bool,
    out: &DeviceTensor<R>,
) -> Result<()> {
    attention_into_with(client, q, k, v, scale, causal, out, AttentionStrategy::Auto)
}

/// [`attention_into`] with an explicit kernel choice.
#[allow(clippy::too_many_arguments)]
pub fn attention_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    scale: f32,
    causal: bool,
    out: &DeviceTensor<R>,
    strategy: AttentionStrategy,
) -> Result<()> {
    const OP: &str = "attention";
    let (batch, lq, hq, d) = validate::operands(client, OP, q, k, v, out, scale)?;
    let (lk, hkv) = (k.shape()[k.rank() - 3], k.shape()[k.rank() - 2]);
    if lk == 0 {
        return Err(OpsError::shape(OP, "k and v have no rows"));
    }
    if causal && lq > lk {
        return Err(OpsError::invalid(
            OP,
            format!(
                "causal attention needs Lq <= Lk (got Lq {lq}, Lk {lk}): a query would see no key"
            ),
        ));
    }
    let problem = Problem {
        q,
        k,
        v,
        out,
        batch,
        lq,
        hq,
        hkv,
        d,
        kv_rows: lk,
        len: KvLen::Host(lk),
        causal,
        scale,
        workspace: None,
        slots: None,
    };
    plan::run(client, OP, &problem, strategy)
}

/// Causal attention of `q[Lq, Hq, D]` over the first `kv_len` rows of a preallocated cache
/// (`k_cache`, `v_cache`: `[max_len, Hkv, D]`), read in place. Query `i` sees cache row `j` iff
/// `j <= i + kv_len - Lq` (the queries are the last `Lq` positions).
///
/// With [`KvLen::Host`] the host checks `Lq <= kv_len <= max_len`. With [`KvLen::Device`] the
/// kernels read the length when they run; the key split is then sized for `max_len` (splits past
/// the length contribute nothing), a length above `max_len` is clamped to it, and a query that
/// sees no row (length below `Lq`) gets zeros.
#[allow(clippy::too_many_arguments)]
pub fn attention_cached_into<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    kv_len: KvLen<'_, R>,
    scale: f32,
    out: &DeviceTensor<R>,
    workspace: Option<&AttentionWorkspace<R>>,
) -> Result<()> {
    attention_cached_into_with(
        client,
        q,
        k_cache,
        v_cache,
        kv_len,
        scale,
        out,
        workspace,
        AttentionStrategy::Auto,
    )
}

/// [`attention_cached_into`] with an explicit kernel choice.
#[allow(clippy::too_many_arguments)]
pub fn attention_cached_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    kv_len: KvLen<'_, R>,
    scale: f32,
    out: &DeviceTensor<R>,
    workspace: Option<&AttentionWorkspace<R>>,
    strategy: AttentionStrategy,
) -> Result<()> {
    const OP: &str = "attention_cached";
    if q.rank() != 3 {
        return Err(OpsError::shape(
            OP,
            format!("q must be [Lq, Hq, D], got {:?}", q.shape()),
        ));
    }
    let (_, lq, hq, d) = validate::operands(client, OP, q, k_cache, v_cache, out, scale)?;
    let (max_len, hkv) = (k_cache.shape()[0], k_cache.shape()[1]);
    validate::cache_len(OP, kv_len, lq, max_len)?;
    let problem = Problem {
        q,
        k: k_cache,
        v: v_cache,
        out,
        batch: 1,
        lq,
        hq,
        hkv,
        d,
        kv_rows: max_len,
        len: kv_len,
        causal: true,
        scale,
        workspace,
        slots: None,
    };
    plan::run(client, OP, &problem, strategy)
}

/// Decode attention over a ragged batch: one query per sequence, each sequence in its own slot
/// of a shared cache. Row `b` of `q[B, Hq, D]` is the newest token of a sequence at position
/// `seqs[b, 0]` of slot `seqs[b, 1]`; it sees rows `0..=position` of that slot of `k_cache` /
/// `v_cache` (`[slots, max_len, Hkv, D]`), and its output goes to row `b` of `out`.
///
/// `seqs` is a contiguous u32 `[B, 2]` device table read when the kernels run, so a captured
/// graph can be replayed with new positions and slots. The host cannot check it: a position
/// past `max_len - 1` is clamped to it and a slot past the last to the last. Two rows may name
/// the same slot (they then read the same keys).
///
/// Each row is computed exactly as [`attention_cached_into`] computes that sequence alone with
/// a device length of `position + 1` over a `[max_len, Hkv, D]` cache (the keys are split as for
/// one sequence, whatever `B` is), so a sequence's result does not depend on what it is batched
/// with.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_ragged_into<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    seqs: &DeviceTensor<R>,
    scale: f32,
    out: &DeviceTensor<R>,
    workspace: Option<&AttentionWorkspace<R>>,
) -> Result<()> {
    const OP: &str = "attention_decode_ragged";
    if q.rank() != 3 {
        return Err(OpsError::shape(
            OP,
            format!("q must be [B, Hq, D], got {:?}", q.shape()),
        ));
    }
    if k_cache.rank() != 4 {
        return Err(OpsError::shape(
            OP,
            format!(
                "the cache must be [slots, max_len, Hkv, D], got {:?}",
                k_cache.shape()
            ),
        ));
    }
    let ks = k_cache.shape();
    let (slots, max_len, hkv, d) = (ks[0], ks[1], ks[2], ks[3]);
    if slots == 0 || max_len == 0 {
        return Err(OpsError::shape(OP, "the cache has no rows"));
    }
    // The shared checks on the flat views: q as B queries, the cache as `slots * max_len` rows.
    let flat = [slots * max_len, hkv, d];
    let (k_flat, v_flat) = (k_cache.reshape(&flat)?, v_cache.reshape(&flat)?);
    if v_cache.shape() != ks {
        return Err(OpsError::shape(
            OP,
            format!("v {:?} does not match k {:?}", v_cache.shape(), ks),
        ));
    }
    let (_, batch, hq, _) = validate::operands(client, OP, q, &k_flat, &v_flat, out, scale)?;
    if seqs.dtype() != crate::DType::U32 || seqs.shape() != [batch, 2] || !seqs.is_contiguous() {
        return Err(OpsError::shape(
            OP,
            format!(
                "seqs must be a contiguous u32 [{batch}, 2] table of (position, slot), got {} {:?}",
                seqs.dtype(),
                seqs.shape()
            ),
        ));
    }
    let q4 = q.reshape(&[batch, 1, hq, d])?;
    let out4 = out.reshape(&[batch, 1, hq, d])?;
    let problem = Problem {
        q: &q4,
        k: k_cache,
        v: v_cache,
        out: &out4,
        batch,
        lq: 1,
        hq,
        hkv,
        d,
        kv_rows: max_len,
        len: KvLen::Device(seqs),
        causal: true,
        scale,
        workspace,
        slots: Some(slots),
    };
    plan::run(client, OP, &problem, AttentionStrategy::Auto)
}
