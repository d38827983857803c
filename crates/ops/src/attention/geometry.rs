//! What every attention kernel knows at run time: the sizes, the KV length and the key split
//! ([`Geometry`]), and the two rules derived from them (the length a launch works with, the keys
//! a query sees).

use cubecl::prelude::*;

use super::KvLen;
use crate::{DType, DeviceTensor};

/// The runtime geometry shared by the kernels: sizes, the KV length and the key split. The split
/// kernels take it as one launch argument (beside their [`SplitBuffers`]); the prefill kernel
/// builds it from its own scalars.
#[derive(CubeLaunch, CubeType, Clone, Copy)]
pub(crate) struct Geometry {
    /// KV length when it is known on the host (ignored with a device length).
    pub len_host: u32,
    /// Queries per sequence.
    pub lq: u32,
    pub hq: u32,
    pub hkv: u32,
    /// Query heads per KV head.
    pub group: u32,
    /// Rows of the K/V buffers per sequence (`lk`, or `max_len` for a cache).
    pub kv_rows: u32,
    /// Keys per split (the whole range when there is one split).
    pub chunk: u32,
    pub splits: u32,
    /// Cubes along the row axis per (sequence, KV head).
    pub row_blocks: u32,
    pub scale: f32,
    /// 1 for a ragged batch: the device buffer holds a `(position, slot)` pair per sequence
    /// (see [`kv_len`], [`kv_first_row`]); 0 for one length shared by every sequence.
    pub ragged: u32,
    /// Sequences the K/V buffers hold (`slots * kv_rows` rows): bounds a ragged batch's slots.
    pub slots: u32,
}

/// The buffers of a split kernel: the operands, the device length (a placeholder when it is on
/// the host), the output, and the per-split partials (accumulators and `(max, sum)` pairs). `E` is
/// what the kernel reads q/k/v and writes the output as (an element or a vector of them), `P` what
/// it writes the accumulator partials as.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct SplitBuffers<E: CubePrimitive, P: CubePrimitive> {
    pub q: Box<[E]>,
    pub k: Box<[E]>,
    pub v: Box<[E]>,
    pub len_buf: Box<[u32]>,
    pub out: Box<[E]>,
    pub part_acc: Box<[P]>,
    pub part_stats: Box<[f32]>,
}

/// The KV length sequence `b` works with: from the device buffer (clamped to the buffer's rows,
/// so a bad length can never read outside the cache) or from the host. In a ragged batch the
/// buffer holds sequence `b`'s query position at `2b`, and the query sees the keys up to it.
#[cube]
pub(crate) fn kv_len(len_buf: &[u32], geo: &Geometry, b: u32, #[comptime] device_len: bool) -> u32 {
    let mut len = geo.len_host;
    if comptime![device_len] {
        if geo.ragged != 0 {
            len = min(len_buf[(2 * b) as usize] + 1, geo.kv_rows);
        } else {
            len = min(len_buf[0], geo.kv_rows);
        }
    }
    len
}

/// The first K/V row of sequence `b`: `b * kv_rows`, or in a ragged batch the first row of the
/// slot the device buffer names at `2b + 1` (clamped to the slots the buffers hold).
#[cube]
pub(crate) fn kv_first_row(len_buf: &[u32], geo: &Geometry, b: u32) -> u32 {
    let mut slot = b;
    if geo.ragged != 0 {
        slot = min(len_buf[(2 * b + 1) as usize], geo.slots - 1);
    }
    slot * geo.kv_rows
}

/// The rows of one split's partials (`part_acc` / `part_stats`): every output row of the launch,
/// `sequences x queries x query heads`, the cube grid's Z axis counting sequences times row
/// blocks.
#[cube]
pub(crate) fn partial_rows(geo: &Geometry) -> usize {
    (CUBE_COUNT_Z / geo.row_blocks * geo.lq * geo.hq) as usize
}

/// The number of keys query `i` sees: all `len` of them, or with the causal rule
/// (`j <= i + len - lq`) `i + 1 + len - lq` clamped to `[0, len]`.
#[cube]
pub(crate) fn visible_keys(i: u32, len: u32, lq: u32, #[comptime] causal: bool) -> u32 {
    let mut n = len;
    if comptime![causal] {
        n = min((i + 1 + len).saturating_sub(lq), len);
    }
    n
}

/// The buffer a kernel reads a device length (or start row) from: the caller's tensor, or a
/// 4-byte placeholder bound where the length is on the host and the kernel never reads it.
pub(crate) fn len_buffer<R: Runtime>(
    client: &ComputeClient<R>,
    len: KvLen<'_, R>,
) -> DeviceTensor<R> {
    match len.device() {
        Some(t) => t.clone(),
        None => DeviceTensor::empty(client, &[1], DType::U32),
    }
}
