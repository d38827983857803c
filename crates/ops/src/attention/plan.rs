//! Which kernel a problem runs with ([`AttentionStrategy`] to a blueprint), and the dispatch.

use cubecl::prelude::*;

use super::flash::{self, FlashBlueprint};
use super::geometry::len_buffer;
use super::split_kv::{self, SplitKvBlueprint};
use super::split_kv_mma::{self, SplitKvMmaBlueprint};
use super::tiled::{self, TiledBlueprint};
use super::workspace::{keys_fit_cluster, CLUSTER_SPLITS};
use super::{
    AttentionStrategy, AttentionWorkspace, FlashTiling, KvLen, SplitKvTiling, DECODE_MAX_QUERIES,
};
use crate::{caps, DType, DeviceTensor, OpsError, Result};

/// A validated attention problem.
pub(crate) struct Problem<'a, R: Runtime> {
    pub q: &'a DeviceTensor<R>,
    pub k: &'a DeviceTensor<R>,
    pub v: &'a DeviceTensor<R>,
    pub out: &'a DeviceTensor<R>,
    pub batch: usize,
    pub lq: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Rows of k/v per sequence (Lk, or the cache's max_len).
    pub kv_rows: usize,
    pub len: KvLen<'a, R>,
    pub causal: bool,
    pub scale: f32,
    /// Where the split partials go; `None` allocates them per call.
    pub workspace: Option<&'a AttentionWorkspace<R>>,
    /// A ragged batch over a cache of this many slots: the device length buffer holds a
    /// `(position, slot)` pair per sequence (`len` is then [`KvLen::Device`]).
    pub slots: Option<usize>,
}

impl<R: Runtime> Problem<'_, R> {
    pub fn group(&self) -> usize {
        self.hq / self.hkv
    }

    /// The most keys any launch of this problem can see: sizes the key split.
    pub fn max_len(&self) -> usize {
        match self.len {
            KvLen::Host(l) => l,
            KvLen::Device(_) | KvLen::Appended(_) => self.kv_rows,
        }
    }

    pub fn len_host(&self) -> u32 {
        match self.len {
            KvLen::Host(l) => l as u32,
            KvLen::Device(_) | KvLen::Appended(_) => 0,
        }
    }

    pub fn device_len(&self) -> bool {
        self.len.device().is_some()
    }

    /// The length is [`KvLen::Appended`]: the first keys may be loaded before the wait.
    pub fn appended(&self) -> bool {
        matches!(self.len, KvLen::Appended(_))
    }

    pub fn rows_out(&self) -> usize {
        self.batch * self.lq * self.hq
    }

    /// Sequences the key split is sized for: one in a ragged batch, so that each sequence is
    /// split (and so rounded) the same whatever else is in the batch.
    pub fn split_batch(&self) -> usize {
        if self.slots.is_some() {
            1
        } else {
            self.batch
        }
    }

    /// Blocks of `rows` query rows per KV head (a KV head's queries: its group's heads at every
    /// query position).
    pub fn row_blocks(&self, rows: usize) -> usize {
        (self.lq * self.group()).div_ceil(rows)
    }

    /// Cubes of a split launch that takes `rows` query rows per cube, before the keys are split:
    /// row blocks x KV heads x [`Problem::split_batch`] sequences.
    pub fn unsplit_cubes(&self, rows: usize) -> usize {
        self.row_blocks(rows) * self.hkv * self.split_batch()
    }
}

/// The kernel a problem runs with.
enum Plan {
    Tiled(TiledBlueprint),
    TensorCore(FlashBlueprint),
    Decode(SplitKvBlueprint),
    TensorCoreDecode(SplitKvMmaBlueprint, usize),
}

/// Whether the tensor-core kernels take the problem: `mma` m16n8k16 for the dtype, a head dim
/// that is a multiple of 16 up to 128, and a positive scale (they keep row maxima in raw score
/// units).
fn tensor_cores_fit<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> bool {
    tensor_cores_take(client, p.q.dtype(), p.d) && p.scale > 0.0
}

/// The dtype and head dim half of [`tensor_cores_fit`].
fn tensor_cores_take<R: Runtime>(client: &ComputeClient<R>, dtype: DType, d: usize) -> bool {
    caps::has_mma_m16n8k16(client, dtype) && d.is_multiple_of(16) && d <= 128
}

fn shared_budget<R: Runtime>(client: &ComputeClient<R>) -> usize {
    client.properties().hardware.max_shared_memory_size
}

fn tensor_core_plan<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    tiling: FlashTiling,
) -> Option<Plan> {
    if !tensor_cores_fit(client, p) {
        return None;
    }
    let bp = FlashBlueprint::new(p.d, tiling, p.causal, p.device_len());
    (bp.shared_bytes(p.q.dtype().size()) <= shared_budget(client)).then_some(Plan::TensorCore(bp))
}

fn tensor_core_decode_plan<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    tiling: SplitKvTiling,
) -> Option<Plan> {
    if !tensor_cores_fit(client, p) {
        return None;
    }
    let elem = p.q.dtype().size();
    let budget = shared_budget(client);
    let bp = SplitKvMmaBlueprint::new(p.d, tiling, p.causal, p.device_len()).fitting(elem, budget);
    (bp.shared_bytes(elem) <= budget).then_some(Plan::TensorCoreDecode(bp, tiling.cubes_per_sm))
}

/// The tensor-core decode tiling [`AttentionStrategy::Auto`] takes:
/// - where the GPU has clusters and the keys fit one cluster's cubes at one 128-key tile each,
///   eight planes on that tile (the clustered launch merges its own splits; H100, 1.5B shape at
///   640 keys: 666 tok/s against 652 with four planes on two 64-key tiles and 635 with the merge
///   kernel);
/// - where 128-key tiles still give every SM a cube, eight planes on 128-key tiles: twice the
///   bytes in flight per cube of the default's 64-key tiles (H200, 1.5B shape at the end of a
///   32k context, in the model's decode step: the attention kernel adds 11.8 µs per layer
///   against 16.5 with 64-key tiles, 635 tok/s against 597), and eight planes rather than four
///   hide more of each tile's MMA and softmax latency (one cube per SM, so its planes are all
///   the SM runs: bf16 decode at the end of a 32k context 693.2 tok/s against 682.5 with four
///   and 622.1 with two, same binary, two rounds each); more stages of 64-key tiles, up to five
///   (four tiles in flight), were slower than two;
/// - the default elsewhere (short caches without clusters, where 64-key tiles split the keys
///   over more cubes).
fn auto_decode_tiling<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> SplitKvTiling {
    let max_len = p.max_len();
    let clustered = caps::has_clusters(client) && keys_fit_cluster(max_len, WIDE_TILES.bk);
    let fills_sms = max_len.div_ceil(WIDE_TILES.bk) * p.unsplit_cubes(16)
        >= WIDE_TILES.cubes_per_sm * caps::num_sms(client) as usize;
    if clustered || fills_sms {
        WIDE_TILES
    } else {
        SplitKvTiling::default()
    }
}

/// Eight planes on 128-key tiles, one cube per SM: the tiling of the clustered launch and of
/// long caches ([`auto_decode_tiling`]).
const WIDE_TILES: SplitKvTiling = SplitKvTiling {
    warps: 8,
    bk: 128,
    cubes_per_sm: 1,
};

/// The most cache rows for which [`AttentionStrategy::Auto`] decodes a single query token of one
/// sequence with the clustered launch (the key splits merged inside one thread-block cluster,
/// no merge kernel after it), or `None` where the runtime has no clusters or the tensor-core
/// decode kernel does not take `dtype` and `head_dim`. The launch is planned for the rows the
/// cache tensors have, not for the length the kernel reads on the device, so a caller whose
/// length stays within this bound gets the clustered launch by passing a view of the cache's
/// first rows.
pub fn clustered_decode_keys<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    head_dim: usize,
) -> Option<usize> {
    let fits = caps::has_clusters(client)
        && tensor_cores_take(client, dtype, head_dim)
        && SplitKvMmaBlueprint::new(head_dim, WIDE_TILES, true, true).shared_bytes(dtype.size())
            <= shared_budget(client);
    fits.then_some(CLUSTER_SPLITS * WIDE_TILES.bk)
}

fn decode_plan<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> Option<Plan> {
    let dtype = p.q.dtype();
    let plane = caps::plane_size_min(client) as usize;
    if !caps::has_plane_ops(client)
        || client.properties().hardware.plane_size_max as usize != plane
        || plane < 4
    {
        return None;
    }
    let n = caps::vector_size_for(client, dtype, p.d);
    let lpk = p.d / n;
    if !lpk.is_power_of_two() || lpk > plane {
        return None;
    }
    let rows_total = p.lq * p.group();
    let blocks = rows_total.div_ceil(8);
    let rows = rows_total.div_ceil(blocks);
    let units = 256usize.min(client.properties().hardware.max_units_per_cube as usize);
    if !units.is_multiple_of(plane) || units < plane || rows * lpk > units {
        return None;
    }
    let bp = SplitKvBlueprint {
        d: p.d,
        n,
        rows,
        unroll: 4,
        units,
        plane,
        causal: p.causal,
        device_len: p.device_len(),
        partial: false,
    };
    (bp.shared_bytes() <= shared_budget(client)).then_some(Plan::Decode(bp))
}

fn tiled_plan<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> Result<Plan> {
    let budget = shared_budget(client);
    let elem = p.q.dtype().size();
    for bk in [32, 16, 8] {
        let bp = TiledBlueprint {
            d: p.d,
            br: 16,
            bk,
            upr: 8,
            causal: p.causal,
            device_len: p.device_len(),
            partial: false,
        };
        if bp.shared_bytes(elem) <= budget {
            return Ok(Plan::Tiled(bp));
        }
    }
    Err(OpsError::UnsupportedFeature {
        op: "attention",
        runtime: caps::runtime_name(client),
        feature: format!(
            "{budget} bytes of shared memory per cube are too few for head dim {}",
            p.d
        ),
    })
}

/// Rejects tile values the tensor-core kernels cannot be built with.
fn check_tiling(op: &'static str, strategy: AttentionStrategy) -> Result<()> {
    let warps_ok = |w: usize| matches!(w, 1 | 2 | 4 | 8);
    let bad = |what: String| Err(OpsError::invalid(op, what));
    match strategy {
        AttentionStrategy::TensorCore(t)
            if !warps_ok(t.warps) || !t.bk.is_multiple_of(16) || !(16..=128).contains(&t.bk) =>
        {
            bad(format!(
                "{t:?}: warps must be 1, 2, 4 or 8 and bk a multiple of 16 in 16..=128"
            ))
        }
        AttentionStrategy::TensorCoreDecode(t)
            if !warps_ok(t.warps)
                || t.bk == 0
                || !t.bk.is_multiple_of(16 * t.warps)
                || t.bk > 128
                || !(1..=8).contains(&t.cubes_per_sm) =>
        {
            bad(format!(
                "{t:?}: warps must be 1, 2, 4 or 8, bk a positive multiple of 16 * warps up to \
                 128, cubes_per_sm in 1..=8"
            ))
        }
        _ => Ok(()),
    }
}

fn plan<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    strategy: AttentionStrategy,
) -> Result<Plan> {
    check_tiling(op, strategy)?;
    let unsupported = |what: &str| OpsError::UnsupportedFeature {
        op,
        runtime: caps::runtime_name(client),
        feature: what.to_string(),
    };
    match strategy {
        AttentionStrategy::Auto => {
            let fast = if p.lq > DECODE_MAX_QUERIES {
                tensor_core_plan(client, p, FlashTiling::default())
            } else {
                tensor_core_decode_plan(client, p, auto_decode_tiling(client, p))
                    .or_else(|| tensor_core_decode_plan(client, p, SplitKvTiling::default()))
                    .or_else(|| decode_plan(client, p))
            };
            match fast {
                Some(plan) => Ok(plan),
                None => tiled_plan(client, p),
            }
        }
        AttentionStrategy::Tiled => tiled_plan(client, p),
        AttentionStrategy::TensorCore(t) => tensor_core_plan(client, p, t).ok_or_else(|| {
            unsupported("tensor-core attention (mma f16/bf16 m16n8k16, head dim % 16 == 0, <= 128)")
        }),
        AttentionStrategy::Decode => decode_plan(client, p)
            .ok_or_else(|| unsupported("split-KV decoding (plane operations of a fixed size)")),
        AttentionStrategy::TensorCoreDecode(t) => {
            tensor_core_decode_plan(client, p, t).ok_or_else(|| {
                unsupported(
                    "tensor-core decoding (mma f16/bf16 m16n8k16, head dim % 16 == 0, <= 128)",
                )
            })
        }
    }
}

/// Plans and launches `p` (the split kernels end with a merge launch when they split the keys).
pub(crate) fn run<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    strategy: AttentionStrategy,
) -> Result<()> {
    let plan = plan(client, op, p, strategy)?;
    let len_t = len_buffer(client, p.len);
    let sms = caps::num_sms(client) as usize;
    match plan {
        Plan::TensorCore(bp) => flash::launch(client, p, &len_t, bp),
        Plan::Tiled(bp) => tiled::launch(client, op, p, &len_t, bp, 2 * sms)?,
        Plan::Decode(bp) => split_kv::launch(client, op, p, &len_t, bp, sms)?,
        Plan::TensorCoreDecode(bp, per_sm) => {
            split_kv_mma::launch(client, op, p, &len_t, bp, per_sm * sms, None)?
        }
    }
    Ok(())
}

/// Launches `p` (one query of one sequence, `p.q` the first `Hq · D` elements of `rope.qkv`) on
/// the tensor-core decode kernel with RoPE and the cache append inside, where
/// [`AttentionStrategy::Auto`] picks that kernel for it; returns false, having launched nothing,
/// where it picks another.
pub(crate) fn run_with_rope<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    rope: &split_kv_mma::RopeLaunch<'_, R>,
) -> Result<bool> {
    debug_assert!(p.batch == 1 && p.lq == 1 && p.slots.is_none());
    let Plan::TensorCoreDecode(bp, per_sm) = plan(client, op, p, AttentionStrategy::Auto)? else {
        return Ok(false);
    };
    let len_t = len_buffer(client, p.len);
    let target = per_sm * caps::num_sms(client) as usize;
    split_kv_mma::launch(client, op, p, &len_t, bp, target, Some(rope))?;
    Ok(true)
}
