//! Flash-decoding on tensor cores (CUDA only): the split-KV decode of `split_kv.rs` with the
//! FlashAttention step of `flash_step.rs` in place of plane shuffles.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::barrier::{copy_async, Barrier};
use cubecl::prelude::*;

use super::cluster_merge::{
    block_rows, exchange_begin, exchange_combine, exchange_len, exchange_ready, exchange_wait,
    send_element, send_stats, window_address,
};
use super::flash_step::{
    exp2_approx, first_kv_tile, flash_step, lane_addresses, lane_rows, load_q_fragments,
    next_kv_tile, quad_sum, queue_kv_tile_part, zeroed_output, StepShape,
};
use super::geometry::{kv_first_row, kv_len, partial_rows, visible_keys, Geometry, SplitBuffers};
use super::merge::{merge_row, MergeBlueprint};
use super::plan::Problem;
use super::workspace::{Split, CLUSTER_SPLITS};
use super::SplitKvTiling;
use crate::gemm::split_k::fence_device;
use crate::online_softmax::EMPTY_MAX;
use crate::{DeviceTensor, OpsError, Result};

#[cfg(test)]
mod cuda_source;

/// Elements of the kernel's 16-bit dtype in one 32-bit word of the planes' merge buffers, which
/// live in the K/V stages' memory.
const WORD_ELEMS: usize = 2;

/// One f32 of the planes' merge buffers, stored in the K/V stages' memory as the bits of two
/// elements of the dtype.
type Word<F> = Vector<F, Const<WORD_ELEMS>>;

/// The comptime shape of [`split_kv_mma_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SplitKvMmaBlueprint {
    pub d: usize,
    /// Planes per cube; each takes `bk / warps` keys of every tile.
    pub warps: usize,
    /// Keys per K/V tile (loaded by the whole cube).
    pub bk: usize,
    pub causal: bool,
    pub device_len: bool,
    pub partial: bool,
    /// Signal `griddepcontrol.launch_dependents` first: set for a launch whose cubes all fit on
    /// the GPU at once (decode), so that the merge and, through its own early signal, the output
    /// projection launch during this kernel (the projection then streams its weights while the
    /// attention runs).
    pub trigger: bool,
    /// Queue the copies of the first tile's keys older than the newest `Lq` before
    /// `griddepcontrol.wait` (programmatic dependent launch; the length is on the device): the
    /// caller guarantees that only the kernel launched just before writes the cache, and only
    /// its newest `Lq` rows ([`super::KvLen::Appended`]).
    pub early: bool,
    /// The decode step's attention block in one launch (one query of one sequence): `q` is the
    /// QKV projection's row (`[(Hq + 2 Hkv) · D]`, biases added), and the kernel rotates the
    /// query heads and the newest key (RoPE, rotate-half, the [`RopeTables`] row of position
    /// `len - 1`) and writes that key and its value to row `len - 1` of the cache itself, where
    /// a separate kernel (`crate::qkv`) would have done both and ended before this one's wait.
    pub rope: bool,
    /// Set for the clustered launch: the partials go to the cubes of the cluster through
    /// distributed shared memory (`super::cluster_merge`), not to the global partial buffers.
    pub exchange: bool,
    /// Set for a plain split launch whose cubes are all resident at once: they merge the
    /// partials themselves, in place of the merge kernel ([`merge_own_partials`]).
    pub merge: Option<MergeBlueprint>,
}

/// The operands a [`SplitKvMmaBlueprint::rope`] launch reads beside the problem's: the QKV row
/// (`[1, (Hq + 2 Hkv) · D]`) and the f32 cos / sin tables (`[rows, D / 2]`), all validated.
pub(crate) struct RopeLaunch<'a, R: Runtime> {
    pub qkv: &'a DeviceTensor<R>,
    pub cos: &'a DeviceTensor<R>,
    pub sin: &'a DeviceTensor<R>,
}

/// The RoPE tables of a [`SplitKvMmaBlueprint::rope`] launch (placeholders otherwise): f32
/// `[rows, D / 2]`, entry `[p, i] = cos(p · inv_freq[i])` and its sine.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct RopeTables {
    pub cos: Box<[f32]>,
    pub sin: Box<[f32]>,
    pub rows: u32,
}

impl SplitKvMmaBlueprint {
    pub fn new(d: usize, tiling: SplitKvTiling, causal: bool, device_len: bool) -> Self {
        Self {
            d,
            warps: tiling.warps,
            bk: tiling.bk,
            causal,
            device_len,
            partial: false,
            trigger: false,
            early: false,
            rope: false,
            exchange: false,
            merge: None,
        }
    }

    pub fn stride(&self) -> usize {
        self.d + 8
    }

    /// Keys each plane handles per tile.
    pub fn wk(&self) -> usize {
        self.bk / self.warps
    }

    /// The step of one plane: its `wk` keys of the tile.
    pub fn step(&self) -> StepShape {
        StepShape {
            d: self.d,
            keys: self.wk(),
            stride: self.stride(),
        }
    }

    /// Whether the planes' f32 merge buffers (`warps · 16` rows of `d` outputs in the K stages,
    /// of two statistics in the V stages) fit the stages they reuse: for a 16-bit dtype always,
    /// as `bk` is a multiple of `16 · warps` and a stage row holds `d + 8` elements.
    pub fn merge_fits_stages(&self, elem: usize) -> bool {
        let stages = 2 * self.bk * self.stride() * elem;
        elem * WORD_ELEMS == 4
            && self.warps * 16 * self.d * 4 <= stages
            && self.warps * 16 * 2 * 4 <= stages
    }

    /// Shared memory of a launch (with the clustered launch's receive buffer and mbarrier,
    /// which the plain launch does not declare).
    pub fn shared_bytes(&self, elem: usize) -> usize {
        (16 + 4 * self.bk) * self.stride() * elem
            + self.warps * 16 * 4
            + 16 * 2 * 4
            + 64
            + exchange_len(self.d, 32 * self.warps) * 4
            + 8
    }
}

/// Flash-decoding on tensor cores. The `Lq * Hq / Hkv` query rows of one KV head (the GQA group,
/// times the few queries) form one 16-row `mma` tile, so each K/V row is read once for all of
/// them; the keys of the cube's split stream through shared memory in `bk`-key tiles
/// (`cp.async`, double-buffered), and the planes share each tile (plane `w` takes keys
/// `w * bk / warps ..`), merging their softmax states at the end. Per key the work is two `mma`s
/// per plane and a few ALU instructions per lane, so the kernel is bound by reading K/V. After a
/// cache append ([`super::KvLen::Appended`], under programmatic dependent launch) the first
/// tile's older keys are copied before `griddepcontrol.wait`, while the append still runs.
#[cube(launch_unchecked)]
pub(crate) fn split_kv_mma_kernel<F: Float>(
    mut io: SplitBuffers<F, f32>,
    geo: Geometry,
    rope: RopeTables,
    counters: &[Atomic<u32>],
    #[comptime] blueprint: SplitKvMmaBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let mut orow_sh = Shared::<[u32]>::new_slice(16usize);
    let rows_here = split_kv_mma::<F>(&mut io, &geo, &rope, &mut orow_sh, 0u32, 0u32, blueprint);
    if comptime![blueprint.merge.is_some()] {
        merge_own_partials::<F>(
            &mut io,
            &geo,
            counters,
            &orow_sh,
            rows_here,
            comptime![blueprint.merge.unwrap()],
        );
    }
}

/// The merge of a plain split launch inside it: each cube counts itself done on its (sequence,
/// KV head, row block)'s counter (after a device-scope fence of its partials), the one that
/// completes the count resets it to zero for the next launch, and the cubes of the first
/// `rows_here` splits, having waited for that reset, merge one row of the block each (row
/// `split`, `split + splits`, ...; [`merge_row`], the merge kernel's arithmetic). Only those
/// few cubes wait, and only for cubes of their own launch; the rest leave at once, and no merge
/// kernel is launched and waited for after this one.
///
/// The waiting cubes need the rest of the launch to run beside them: the launch is set up so
/// only where all its cubes fit on the GPU at once. (Many such launches on concurrent streams
/// could in principle fill every SM with waiting cubes while each has cubes still to start. In
/// practice the GPU starts the cubes of the launch queued first before those of later ones,
/// which keeps the oldest launch moving, but CUDA does not promise that order.)
#[cube]
fn merge_own_partials<F: Float>(
    io: &mut SplitBuffers<F, f32>,
    geo: &Geometry,
    counters: &[Atomic<u32>],
    orow_sh: &[u32],
    rows_here: u32,
    #[comptime] merge: MergeBlueprint,
) {
    let slot = (CUBE_POS_Z * geo.hkv + CUBE_POS_Y) as usize;
    let merger = CUBE_POS_X < rows_here;
    fence_device();
    sync_cube();
    if UNIT_POS == 0 {
        let done = counters[slot].fetch_add(1u32) + 1u32;
        if done == geo.splits {
            counters[slot].store(0u32);
        } else if merger {
            loop {
                if counters[slot].load() == 0u32 {
                    break;
                }
            }
        }
    }
    sync_cube();
    if merger {
        fence_device();
        let rows_out = partial_rows(geo) as u32;
        for r in range_stepped(CUBE_POS_X, rows_here, geo.splits) {
            merge_row::<F>(
                &io.part_acc,
                &io.part_stats,
                &mut io.out,
                orow_sh[r as usize] as usize,
                true,
                geo.splits,
                rows_out,
                merge,
            );
        }
    }
}

/// [`split_kv_mma_kernel`] on clusters of [`CLUSTER_SPLITS`] cubes along the key split (the whole
/// split of one KV head and row block), which then merge their partials themselves: the block's
/// output elements are dealt out over the cluster's cubes, each cube sends its partials of every
/// element into the shared memory of the cube that owns it (`st.async`, completing bytes of that
/// cube's mbarrier), and each cube combines the elements it owns (`super::cluster_merge`). No
/// merge kernel follows, so the output projection waits for one kernel less, and the partials
/// make no round trip through global memory.
#[cube(launch_unchecked, cluster_dim = CubeDim::new_3d(CLUSTER_SPLITS as u32, 1, 1))]
pub(crate) fn split_kv_mma_cluster_kernel<F: Float>(
    mut io: SplitBuffers<F, f32>,
    geo: Geometry,
    rope: RopeTables,
    #[comptime] blueprint: SplitKvMmaBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let mut orow_sh = Shared::<[u32]>::new_slice(16usize);
    let d = comptime![blueprint.d];
    let units = comptime![32 * blueprint.warps];
    let recv_sh = Shared::<[f32]>::new_slice(comptime![exchange_len(d, units)]);
    let bar_sh = Shared::<[u64]>::new_slice(1usize);
    let recv = window_address::<f32>(&recv_sh);
    let bar = window_address::<u64>(&bar_sh);
    exchange_begin(bar, &geo, d, units);
    let rows_here = split_kv_mma::<F>(&mut io, &geo, &rope, &mut orow_sh, recv, bar, blueprint);
    exchange_wait(&bar_sh);
    exchange_combine::<F>(&recv_sh, &mut io.out, &orow_sh, rows_here, d, units);
}

/// The body of both decode kernels: one cube's split, written as partials (or, with one split,
/// as the output; in the clustered launch sent to the cluster's cubes from `recv` and `bar`, its
/// receive buffer's and mbarrier's shared-window addresses, the same in every cube). Returns
/// the rows of the cube's 16-row block that exist; `orow_sh` then holds their output rows.
#[cube]
fn split_kv_mma<F: Float>(
    io: &mut SplitBuffers<F, f32>,
    geo: &Geometry,
    rope: &RopeTables,
    orow_sh: &mut [u32],
    recv: u32,
    bar: u32,
    #[comptime] blueprint: SplitKvMmaBlueprint,
) -> u32 {
    if comptime![blueprint.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }
    let d = comptime![blueprint.d];
    let bk = comptime![blueprint.bk];
    let wk = comptime![blueprint.wk()];
    let warps = comptime![blueprint.warps];
    let stride = comptime![blueprint.stride()];
    let shape = comptime![blueprint.step()];
    let dn = comptime![blueprint.d / 8];
    // scale * log2(e): scores go through ex2.
    let c = geo.scale * f32::new(core::f32::consts::LOG2_E);

    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let size!(NA) = def.vector_size(MatrixIdent::A);
    let size!(NB) = def.vector_size(MatrixIdent::B);
    let size!(NC) = def.vector_size(MatrixIdent::Accumulator);

    let lane = UNIT_POS % 32;
    let warp = UNIT_POS / 32;
    let g = lane / 4;
    let t = lane % 4;
    let split = CUBE_POS_X;
    let hk = CUBE_POS_Y;
    let b = CUBE_POS_Z / geo.row_blocks;
    let rb = CUBE_POS_Z % geo.row_blocks;
    let len = kv_len(&io.len_buf, geo, b, blueprint.device_len);
    let rows_total = geo.lq * geo.group;

    // Rows of the tile: (query i, head hk * group + gg) for rho = rb * 16 + r.
    let first_rho = rb * 16;
    let last_rho = min(first_rho + 15, rows_total - 1);
    let k_begin = split * geo.chunk;
    let split_end = min(k_begin + geo.chunk, len);
    let k_end = max(
        min(
            split_end,
            visible_keys(last_rho / geo.group, len, geo.lq, blueprint.causal),
        ),
        k_begin,
    );
    let k_unmasked = min(
        split_end,
        visible_keys(first_rho / geo.group, len, geo.lq, blueprint.causal),
    );
    let n_tiles = (k_end - k_begin).div_ceil(bk as u32);

    let mut q_sh = Shared::<[F]>::new_aligned_slice(comptime![16 * stride], 16usize);
    let mut k_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let mut v_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let bar0 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);
    let bar1 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let kv_stride = (geo.hkv as usize) * d;
    let kv_base = kv_first_row(&io.len_buf, geo, b) as usize * kv_stride + hk as usize * d;
    let last_key = k_end.saturating_sub(1) as usize;

    // With `early` no kernel still running writes the keys before `settled` (`KvLen::Appended`):
    // their copies go out before the wait, the newest keys' after it, and one barrier waits for
    // both.
    let settled = len.saturating_sub(geo.lq) as usize;
    // A RoPE launch: whether this cube's split holds the newest key (`owner`), and whether that
    // key lies in the cube's first tile after an older one (`direct`, under programmatic
    // dependent launch): the rotated key and its value then go from registers straight into the
    // tile, whose other rows are older keys (those past the newest repeat the one before it,
    // as padding the mask hides), all copied before the wait. Otherwise the cube writes the
    // newest row to the cache and copies it back after a barrier, as the kernel does with a
    // row an append kernel wrote.
    let pos = len.saturating_sub(1);
    let mut owner = false;
    let mut direct = false;
    if comptime![blueprint.rope] {
        owner = len > 0 && pos >= k_begin && pos < split_end;
        if comptime![blueprint.early] {
            direct = owner && pos > 0 && pos < k_begin + bk as u32;
        }
    }
    if comptime![blueprint.early] {
        if n_tiles > 0 {
            if direct {
                queue_tile_but_newest::<F>(
                    &io.k,
                    &io.v,
                    &mut k_sh,
                    &mut v_sh,
                    k_begin as usize,
                    kv_base,
                    kv_stride,
                    (pos - k_begin) as usize,
                    bk,
                    d,
                    stride,
                );
            } else {
                queue_kv_tile_part::<F>(
                    &io.k,
                    &io.v,
                    &mut k_sh,
                    &mut v_sh,
                    k_begin as usize,
                    kv_base,
                    kv_stride,
                    last_key,
                    settled,
                    true,
                    bk,
                    d,
                    stride,
                );
            }
        }
        gpu_asm!("griddepcontrol.wait;");
    }

    if comptime![blueprint.rope] {
        rotate_into_tiles::<F>(
            io,
            &mut q_sh,
            &mut k_sh,
            &mut v_sh,
            rope,
            geo,
            pos,
            owner,
            direct,
            kv_base + pos as usize * kv_stride,
            (pos - k_begin) as usize * stride,
            first_rho,
            rows_total,
            d,
            stride,
            comptime![32 * warps],
        );
        // Orders the cache writes before the copies of that row below (a cube's own global
        // writes are visible to it after a barrier), and the shared-memory stores before their
        // reads. With `early` and no such copy, the wait on `bar0` below orders the stores
        // (its arrival releases them, its wait acquires them, at cube scope).
        if !comptime![blueprint.early] || (owner && !direct) {
            sync_cube();
        }
    } else {
        // Q rows gathered from their heads (16-byte copies).
        let per_row = comptime![d / 8];
        for e in range_stepped(UNIT_POS as usize, comptime![16 * d / 8], CUBE_DIM as usize) {
            let r = e / per_row;
            let col = (e % per_row) * 8;
            let rho = min(first_rho + r as u32, rows_total - 1);
            let qrow = (b * geo.lq + rho / geo.group) * geo.hq + hk * geo.group + rho % geo.group;
            let s = qrow as usize * d + col;
            let dst = r * stride + col;
            copy_async(&io.q[s..s + 8], &mut q_sh[dst..dst + 8], 8u32);
        }
    }
    if comptime![blueprint.early] {
        if n_tiles > 0 && !direct {
            queue_kv_tile_part::<F>(
                &io.k,
                &io.v,
                &mut k_sh,
                &mut v_sh,
                k_begin as usize,
                kv_base,
                kv_stride,
                last_key,
                settled,
                false,
                bk,
                d,
                stride,
            );
        }
        bar0.commit_copy_async();
        bar0.arrive_and_wait();
    } else {
        first_kv_tile::<F>(
            &io.k,
            &io.v,
            &mut k_sh,
            &mut v_sh,
            &bar0,
            n_tiles,
            k_begin as usize,
            kv_base,
            kv_stride,
            last_key,
            bk,
            d,
            stride,
        );
    }

    let lanes = lane_addresses(lane);
    let q_frag = load_q_fragments::<F, NA>(&def, &q_sh, lanes.q_row * stride, &lanes, shape);

    let mut o_acc = zeroed_output::<NC>(shape);
    let mut s_acc = Array::<Vector<f32, NC>>::new(comptime![shape.nk() * 2]);
    let rho0 = min(first_rho + g, rows_total - 1);
    let rho1 = min(first_rho + g + 8, rows_total - 1);
    let lim0 = min(
        split_end,
        visible_keys(rho0 / geo.group, len, geo.lq, blueprint.causal),
    );
    let lim1 = min(
        split_end,
        visible_keys(rho1 / geo.group, len, geo.lq, blueprint.causal),
    );
    let mut rows = lane_rows(t, lim0, lim1);
    let wkey = warp as usize * wk;

    for kt in 0..n_tiles {
        let buf = next_kv_tile::<F>(
            &io.k,
            &io.v,
            &mut k_sh,
            &mut v_sh,
            &bar0,
            &bar1,
            kt,
            n_tiles,
            k_begin as usize,
            kv_base,
            kv_stride,
            last_key,
            bk,
            d,
            stride,
        );
        let kbuf = buf * comptime![bk * stride] + wkey * stride;
        let key0 = k_begin + kt * bk as u32 + wkey as u32;
        let masked = key0 + wk as u32 > k_unmasked;
        flash_step::<F, NA, NB, NC>(
            &def, &q_frag, &k_sh, &v_sh, kbuf, &lanes, &mut s_acc, &mut o_acc, &mut rows, masked,
            key0, c, shape,
        );
        sync_cube();
    }

    // Merge the planes: each wrote (max, sum, acc) for the rows of the block that exist. Their
    // f32 buffers are the K/V stages' memory seen as 32-bit words (the loop's last barrier ended
    // every read of the stages, and no copy into them is in flight): a cube of the long-cache
    // tiling then needs 144 KB of shared memory rather than 211 KB.
    let l0 = quad_sum(rows.l0);
    let l1 = quad_sum(rows.l1);
    let o_sh = k_sh
        .as_vectorized_mut()
        .with_vector_size_mut::<Const<WORD_ELEMS>>();
    let st_sh = v_sh
        .as_vectorized_mut()
        .with_vector_size_mut::<Const<WORD_ELEMS>>();
    let rows_here = block_rows(geo);
    let wrow = warp as usize * 16;
    let col = (2 * t) as usize;
    if g < rows_here {
        #[unroll]
        for n in 0..dn {
            let o0 = o_acc[n * 2];
            let base0 = (wrow + g as usize) * d + n * 8 + col;
            o_sh[base0] = Word::<F>::reinterpret(o0.extract(0usize));
            o_sh[base0 + 1] = Word::<F>::reinterpret(o0.extract(1usize));
        }
    }
    if g + 8 < rows_here {
        #[unroll]
        for n in 0..dn {
            let o1 = o_acc[n * 2 + 1];
            let base1 = (wrow + g as usize + 8) * d + n * 8 + col;
            o_sh[base1] = Word::<F>::reinterpret(o1.extract(0usize));
            o_sh[base1 + 1] = Word::<F>::reinterpret(o1.extract(1usize));
        }
    }
    if t == 0 {
        st_sh[(wrow + g as usize) * 2] = Word::<F>::reinterpret(rows.m0);
        st_sh[(wrow + g as usize) * 2 + 1] = Word::<F>::reinterpret(l0);
        st_sh[(wrow + g as usize + 8) * 2] = Word::<F>::reinterpret(rows.m1);
        st_sh[(wrow + g as usize + 8) * 2 + 1] = Word::<F>::reinterpret(l1);
    }
    sync_cube();
    merge_planes::<F>(
        io,
        k_sh.as_vectorized().with_vector_size::<Const<WORD_ELEMS>>(),
        v_sh.as_vectorized().with_vector_size::<Const<WORD_ELEMS>>(),
        orow_sh,
        geo,
        first_rho,
        rows_here,
        c,
        recv,
        bar,
        blueprint,
    );
    rows_here
}

/// Combines the planes' `(max, sum, acc)` of the block's `rows_here` rows into the cube's
/// output (or partials, or with [`SplitKvMmaBlueprint::exchange`] the partials sent to the
/// cubes of the cluster that own them): one unit per row first finds the row's maximum, each
/// plane's weight `2^(max_w c - max c)`, the weighted sum and the row's output row (kept in
/// `orow_sh` for the cluster's merge), then every unit combines output elements with those
/// weights, so that no element recomputes the row's statistics.
#[cube]
#[allow(clippy::too_many_arguments)]
fn merge_planes<F: Float>(
    io: &mut SplitBuffers<F, f32>,
    o_sh: &[Word<F>],
    st_sh: &[Word<F>],
    orow_sh: &mut [u32],
    geo: &Geometry,
    first_rho: u32,
    rows_here: u32,
    c: f32,
    recv: u32,
    bar: u32,
    #[comptime] blueprint: SplitKvMmaBlueprint,
) {
    let d = comptime![blueprint.d];
    let units = comptime![32 * blueprint.warps];
    if comptime![blueprint.exchange] {
        exchange_ready();
    }
    let warps = comptime![blueprint.warps];
    let empty = f32::new(EMPTY_MAX);
    let b = CUBE_POS_Z / geo.row_blocks;
    let rows_out = partial_rows(geo);
    let split_rows = CUBE_POS_X as usize * rows_out;
    let mut w_sh = Shared::<[f32]>::new_slice(comptime![warps * 16]);
    let mut inv_sh = Shared::<[f32]>::new_slice(16usize);
    if UNIT_POS < rows_here {
        let r = UNIT_POS as usize;
        let rho = first_rho + UNIT_POS;
        let mut mm = empty;
        #[unroll]
        for w in 0..warps {
            mm = max(mm, f32::reinterpret(st_sh[(w * 16 + r) * 2]));
        }
        let mc = select(mm == empty, 0f32, mm * c);
        let mut ll = 0f32;
        #[unroll]
        for w in 0..warps {
            let f = exp2_approx(f32::reinterpret(st_sh[(w * 16 + r) * 2]) * c - mc);
            w_sh[r * warps + w] = f;
            ll += f32::reinterpret(st_sh[(w * 16 + r) * 2 + 1]) * f;
        }
        let orow =
            (b * geo.lq + rho / geo.group) * geo.hq + CUBE_POS_Y * geo.group + rho % geo.group;
        orow_sh[r] = orow;
        // The merge works in natural units of the scaled scores.
        let m_nat = select(
            mm == empty,
            empty,
            mm * c * f32::new(core::f32::consts::LN_2),
        );
        if comptime![blueprint.exchange] {
            send_stats(recv, bar, UNIT_POS, m_nat, ll, d, units);
        } else if comptime![blueprint.partial] {
            let prow = split_rows + orow as usize;
            io.part_stats[prow * 2] = m_nat;
            io.part_stats[prow * 2 + 1] = ll;
        } else {
            inv_sh[r] = select(ll > 0f32, 1f32 / ll, 0f32);
        }
    }
    sync_cube();

    for e in range_stepped(UNIT_POS as usize, rows_here as usize * d, CUBE_DIM as usize) {
        let r = e / d;
        let dd = e % d;
        let mut acc = 0f32;
        #[unroll]
        for w in 0..warps {
            acc += f32::reinterpret(o_sh[(w * 16 + r) * d + dd]) * w_sh[r * warps + w];
        }
        let orow = orow_sh[r] as usize;
        if comptime![blueprint.exchange] {
            send_element(recv, bar, e as u32, acc, d, units);
        } else if comptime![blueprint.partial] {
            io.part_acc[(split_rows + orow) * d + dd] = acc;
        } else {
            io.out[orow * d + dd] = F::cast_from(acc * inv_sh[r]);
        }
    }
}

/// `(a, b)` rotated by RoPE with factors `(cos, sin)`, rounded to the dtype: the arithmetic of
/// the separate kernel (`crate::qkv`), so that both paths give the same bits.
#[cube]
fn rotate<F: Float>(a: F, b: F, cos: f32, sin: f32) -> (F, F) {
    let a = f32::cast_from(a);
    let b = f32::cast_from(b);
    (
        F::cast_from(a * cos - b * sin),
        F::cast_from(b * cos + a * sin),
    )
}

/// A RoPE launch's work after the wait: the query rows of the block gathered from their heads
/// and rotated at position `pos` into `q_sh` (rows past the last repeat it), and in the `owner`
/// cube KV head `CUBE_POS_Y`'s newest key (rotated) and value written to cache row `dst` (the
/// element offset of that row's head) and, with `direct`, to element `row` of the first tile's
/// shared-memory buffers. Every load is issued before the first result is used, so the cube
/// waits for one memory latency, not one per row pass.
#[cube]
#[allow(clippy::too_many_arguments)]
fn rotate_into_tiles<F: Float>(
    io: &mut SplitBuffers<F, f32>,
    q_sh: &mut [F],
    k_sh: &mut [F],
    v_sh: &mut [F],
    rope: &RopeTables,
    geo: &Geometry,
    pos: u32,
    owner: bool,
    direct: bool,
    dst: usize,
    row: usize,
    first_rho: u32,
    rows_total: u32,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] units: usize,
) {
    let half = comptime![d / 2];
    let pairs = comptime![16 * d / 2];
    let iters = comptime![pairs.div_ceil(units)];
    let kv_iters = comptime![half.div_ceil(units)];
    let p = min(pos, rope.rows - 1) as usize * half;
    let hk = CUBE_POS_Y;
    let k_src = (geo.hq + hk) as usize * d;
    let v_src = (geo.hq + geo.hkv + hk) as usize * d;

    let mut kv = Array::<F>::new(comptime![4 * kv_iters]);
    let mut kv_f = Array::<f32>::new(comptime![2 * kv_iters]);
    if owner {
        #[unroll]
        for j in 0..kv_iters {
            let i = min(UNIT_POS as usize + j * units, half - 1);
            kv[4 * j] = io.q[k_src + i];
            kv[4 * j + 1] = io.q[k_src + i + half];
            kv[4 * j + 2] = io.q[v_src + i];
            kv[4 * j + 3] = io.q[v_src + i + half];
            kv_f[2 * j] = rope.cos[p + i];
            kv_f[2 * j + 1] = rope.sin[p + i];
        }
    }
    let mut qv = Array::<F>::new(comptime![2 * iters]);
    let mut qf = Array::<f32>::new(comptime![2 * iters]);
    #[unroll]
    for k in 0..iters {
        let e = min(UNIT_POS as usize + k * units, pairs - 1);
        let i = e % half;
        let rho = min(first_rho + (e / half) as u32, rows_total - 1);
        let src = (hk * geo.group + rho % geo.group) as usize * d + i;
        qv[2 * k] = io.q[src];
        qv[2 * k + 1] = io.q[src + half];
        qf[2 * k] = rope.cos[p + i];
        qf[2 * k + 1] = rope.sin[p + i];
    }

    if owner {
        #[unroll]
        for j in 0..kv_iters {
            let i = UNIT_POS as usize + j * units;
            if i < half {
                let (ka, kb) = rotate::<F>(kv[4 * j], kv[4 * j + 1], kv_f[2 * j], kv_f[2 * j + 1]);
                let va = kv[4 * j + 2];
                let vb = kv[4 * j + 3];
                io.k[dst + i] = ka;
                io.k[dst + i + half] = kb;
                io.v[dst + i] = va;
                io.v[dst + i + half] = vb;
                if direct {
                    k_sh[row + i] = ka;
                    k_sh[row + i + half] = kb;
                    v_sh[row + i] = va;
                    v_sh[row + i + half] = vb;
                }
            }
        }
    }
    #[unroll]
    for k in 0..iters {
        let e = UNIT_POS as usize + k * units;
        if e < pairs {
            let r = e / half;
            let i = e % half;
            let (a, b) = rotate::<F>(qv[2 * k], qv[2 * k + 1], qf[2 * k], qf[2 * k + 1]);
            q_sh[r * stride + i] = a;
            q_sh[r * stride + i + half] = b;
        }
    }
}

/// Queues the copies of the first tile (keys from `tile0`) into buffer 0, all but row `newest`,
/// the rows past it repeating key `tile0 + newest - 1`: only older keys are read, so the copies
/// may go out before `griddepcontrol.wait`. The caller guarantees `tile0 + newest >= 1`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn queue_tile_but_newest<F: Float>(
    k: &[F],
    v: &[F],
    k_sh: &mut [F],
    v_sh: &mut [F],
    tile0: usize,
    kv_base: usize,
    kv_stride: usize,
    newest: usize,
    #[comptime] bk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let per_row = comptime![d / 8];
    let padding = tile0 + newest - 1;
    for e in range_stepped(UNIT_POS as usize, comptime![bk * d / 8], CUBE_DIM as usize) {
        let r = e / per_row;
        let c = (e % per_row) * 8;
        if r != newest {
            let sr = select(r < newest, tile0 + r, padding);
            let s = kv_base + sr * kv_stride + c;
            let t = r * stride + c;
            copy_async(&k[s..s + 8], &mut k_sh[t..t + 8], 8u32);
            copy_async(&v[s..s + 8], &mut v_sh[t..t + 8], 8u32);
        }
    }
}

/// Launches the decode kernel on cubes of `(split, KV head, sequence x 16-row block)`: where the
/// GPU has thread-block clusters and the keys are few enough for one cluster's splits
/// ([`Split::new`]), [`split_kv_mma_cluster_kernel`], which merges its own splits;
/// otherwise [`split_kv_mma_kernel`] with the keys split for about `target` cubes, then the merge
/// kernel when they are split. With `rope` (one query of one sequence, `p.q` the first `Hq · D`
/// elements of `rope.qkv`) the kernel applies RoPE and appends the newest key and value itself
/// ([`SplitKvMmaBlueprint::rope`]).
pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    len_t: &DeviceTensor<R>,
    mut blueprint: SplitKvMmaBlueprint,
    target: usize,
    rope: Option<&RopeLaunch<'_, R>>,
) -> Result<()> {
    let cluster = crate::caps::has_clusters(client);
    let split = Split::new(client, op, p, 16, blueprint.bk, target, cluster)?;
    blueprint.partial = split.partial();
    blueprint.exchange = split.clustered;
    let cubes = split.splits * p.hkv * p.batch * split.row_blocks;
    blueprint.trigger = crate::caps::has_launch_dependents(client)
        && cubes <= crate::caps::num_sms(client) as usize;
    blueprint.early = crate::caps::has_pdl(client) && p.appended();
    let elem = p.q.dtype().size();
    if !blueprint.merge_fits_stages(elem) {
        return Err(OpsError::UnsupportedFeature {
            op,
            runtime: crate::caps::runtime_name(client),
            feature: format!(
                "tensor-core decode with {} planes on {}-key tiles of {elem}-byte elements",
                blueprint.warps, blueprint.bk
            ),
        });
    }
    let count = CubeCount::Static(
        split.splits as u32,
        p.hkv as u32,
        (p.batch * split.row_blocks) as u32,
    );
    let dim = CubeDim::new_1d((32 * blueprint.warps) as u32);
    let dtype = p.q.dtype().elem_type();
    blueprint.rope = rope.is_some();
    // The cubes merge their own partials where they all fit on the GPU at once (`trigger`:
    // no more cubes than SMs, one cube an SM at most) and a workspace holds the counters.
    let counters = split
        .parts
        .counters()
        .filter(|_| split.partial() && !split.clustered && blueprint.trigger);
    if counters.is_some() {
        blueprint.merge = Some(MergeBlueprint::for_cube(
            client,
            p.d,
            split.splits,
            32 * blueprint.warps,
        ));
    }
    // Without RoPE the tables are never read: bind the partial statistics (f32).
    let stats = split.parts.stats();
    let (q, cos, sin, rows) = match rope {
        Some(r) => (r.qkv, r.cos, r.sin, r.cos.shape()[0]),
        None => (p.q, stats, stats, 1),
    };
    // SAFETY: the kernels read and write within the validated shapes of `p`, the partials the
    // split was sized with and the workspace's counters (one a (sequence, KV head, row block),
    // left at zero); without them the counter argument is never touched.
    unsafe {
        let geometry = split.geometry(p);
        let tables = RopeTablesLaunch::new(cos.as_buffer_arg(), sin.as_buffer_arg(), rows as u32);
        if split.clustered {
            split_kv_mma_cluster_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                split.buffers_reading(q, p, len_t),
                geometry,
                tables,
                blueprint,
                dtype,
            );
        } else {
            split_kv_mma_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                split.buffers_reading(q, p, len_t),
                geometry,
                tables,
                counters.unwrap_or(stats).as_buffer_arg(),
                blueprint,
                dtype,
            );
            if counters.is_none() {
                split.finish(client, p);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::SplitKvMmaBlueprint;
    use crate::attention::SplitKvTiling;

    /// Every tiling the kernel takes (`bk` a multiple of `16 · warps` up to 128, head dims that
    /// are multiples of 16 up to 128) has room in its K/V stages for the planes' merge buffers
    /// in a 16-bit dtype; f32 stages are refused, as their words would not be one f32 each.
    #[test]
    fn merge_buffers_fit_the_stages_of_every_tiling() {
        for warps in [1, 2, 4, 8] {
            for bk in (16 * warps..=128).step_by(16 * warps) {
                for d in (16..=128).step_by(16) {
                    let tiling = SplitKvTiling {
                        warps,
                        bk,
                        cubes_per_sm: 1,
                    };
                    let bp = SplitKvMmaBlueprint::new(d, tiling, true, true);
                    assert!(bp.merge_fits_stages(2), "{bp:?}");
                    assert!(!bp.merge_fits_stages(4), "{bp:?}");
                }
            }
        }
    }
}
