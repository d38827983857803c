//! Flash-decoding on tensor cores (CUDA only): the split-KV decode of `split_kv.rs` with the
//! FlashAttention step of `flash_step.rs` in place of plane shuffles.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::barrier::{copy_async, Barrier};
use cubecl::prelude::*;

use super::cluster_merge::{
    block_rows, exchange_begin, exchange_combine, exchange_len, exchange_wait, window_address,
};
use super::flash_step::{
    first_kv_tile, flash_step, lane_addresses, lane_rows, load_q_fragments, next_kv_tile, quad_sum,
    queue_kv_tile_part, zeroed_output, LaneRows, StepShape,
};
use super::geometry::{kv_first_row, kv_len, visible_keys, Geometry, SplitBuffers};
use super::merge::MergeBlueprint;
use super::plan::Problem;
use super::workspace::{Split, CLUSTER_SPLITS};
use super::SplitKvTiling;
use crate::{DeviceTensor, OpsError, Result};

#[cfg(test)]
mod cuda_source;
mod merges;
mod rope;

use merges::{merge_own_partials, merge_planes, Word, WORD_ELEMS};
pub(crate) use rope::RopeLaunch;
use rope::{queue_tile_but_newest, rotate_into_tiles, RopeTables, RopeTablesLaunch};

/// The fewest keys per cube for which a plain split launch merges its own partials rather than
/// leaving them to the merge kernel: its merging cubes wait for the slowest cube of their block,
/// then merge a row each, which pays only where the cubes stream long enough. Decode on an H100
/// (1.5B shape), against the build with the merge kernel and the planes' merge buffers of their
/// own: at the end of 16k and 32k contexts (256 and 512 keys a cube, eight planes on 128-key
/// tiles) bf16 +2.5-2.7%, W4A16 +1.7-2.7%, FP8 +0.2-0.3%, W8A8 -0.9% (32k); at 4k (128 keys a
/// cube, four planes on 64-key tiles) bf16 -3.3% and W8A8 -4.2%, the attention kernel itself
/// about 3 µs longer.
const OWN_MERGE_MIN_KEYS: usize = 256;

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
    /// The planes' f32 merge buffers live in the K/V stages' memory, free after the key loop
    /// ([`Self::merge_fits_stages`]), instead of shared memory of their own. Set for eight
    /// planes (a 32k cube then needs 144 KB instead of 211 KB, and decodes at the same speed)
    /// and by [`Self::fitting`] where the cube would not fit otherwise; not for four planes on
    /// 64-key tiles where they fit, as their buffers in the stages made the H100's bf16 decode
    /// attention at a 4k context 0.8 µs slower.
    pub stage_merge: bool,
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
            stage_merge: tiling.warps >= 8,
        }
    }

    /// This blueprint, with its planes' merge buffers moved into the K/V stages where the cube
    /// would otherwise need more than `budget` bytes of shared memory for `elem`-byte elements.
    pub fn fitting(mut self, elem: usize, budget: usize) -> Self {
        if self.shared_bytes(elem) > budget && self.merge_fits_stages(elem) {
            self.stage_merge = true;
        }
        self
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
        let (outputs, stats) = self.plane_merge_bytes();
        elem * WORD_ELEMS == 4 && outputs <= stages && stats <= stages
    }

    /// Bytes of the planes' f32 merge buffers: their outputs (16 rows of `d` a plane) and their
    /// rows' statistics (max and sum).
    fn plane_merge_bytes(&self) -> (usize, usize) {
        (self.warps * 16 * self.d * 4, self.warps * 16 * 2 * 4)
    }

    /// Shared memory of a launch (with the clustered launch's receive buffer and mbarrier,
    /// which the plain launch does not declare).
    pub fn shared_bytes(&self, elem: usize) -> usize {
        let (outputs, stats) = self.plane_merge_bytes();
        let merge_buffers = if self.stage_merge { 0 } else { outputs + stats };
        (16 + 4 * self.bk) * self.stride() * elem
            + merge_buffers
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
        // The cache lengths and the RoPE tables: the parameters read before the wait besides
        // the caches, which are not `const` (`crate::pdl`). The lengths are advanced by the
        // step's last kernel, which has completed before the kernel before this one waited.
        gpu_asm!("// cubellm.early_params 3 7 8");
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

    // Merge the planes: each wrote (max, sum, acc) for the rows of the block that exist. With
    // `stage_merge` their f32 buffers are the K/V stages' memory seen as 32-bit words (the loop's
    // last barrier ended every read of the stages, and no copy into them is in flight).
    let l0 = quad_sum(rows.l0);
    let l1 = quad_sum(rows.l1);
    let rows_here = block_rows(geo);
    if comptime![blueprint.stage_merge] {
        let o_sh = k_sh
            .as_vectorized_mut()
            .with_vector_size_mut::<Const<WORD_ELEMS>>();
        let st_sh = v_sh
            .as_vectorized_mut()
            .with_vector_size_mut::<Const<WORD_ELEMS>>();
        store_plane::<Word<F>, NC>(o_sh, st_sh, &o_acc, &rows, l0, l1, lane, warp, rows_here, d);
        sync_cube();
        merge_planes::<F, Word<F>>(
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
    } else {
        let mut o_sh = Shared::<[f32]>::new_slice(comptime![warps * 16 * d]);
        let mut st_sh = Shared::<[f32]>::new_slice(comptime![warps * 16 * 2]);
        store_plane::<f32, NC>(
            &mut o_sh, &mut st_sh, &o_acc, &rows, l0, l1, lane, warp, rows_here, d,
        );
        sync_cube();
        merge_planes::<F, f32>(
            io, &o_sh, &st_sh, orow_sh, geo, first_rho, rows_here, c, recv, bar, blueprint,
        );
    }
    rows_here
}

/// Stores lane `lane` of plane `warp`'s share of the plane's `(max, sum, acc)` (`l0`, `l1`: its
/// rows' sums over the quad) into the merge buffers, each f32 as one `W` (an f32, or two 16-bit
/// elements of the K/V stages holding its bits).
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_plane<W: CubePrimitive, NC: Size>(
    o_sh: &mut [W],
    st_sh: &mut [W],
    o_acc: &Array<Vector<f32, NC>>,
    rows: &LaneRows,
    l0: f32,
    l1: f32,
    lane: u32,
    warp: u32,
    rows_here: u32,
    #[comptime] d: usize,
) {
    let g = lane / 4;
    let t = lane % 4;
    let wrow = warp as usize * 16;
    let col = (2 * t) as usize;
    if g < rows_here {
        #[unroll]
        for n in 0..d / 8 {
            let o0 = o_acc[n * 2];
            let base0 = (wrow + g as usize) * d + n * 8 + col;
            o_sh[base0] = W::reinterpret(o0.extract(0usize));
            o_sh[base0 + 1] = W::reinterpret(o0.extract(1usize));
        }
    }
    if g + 8 < rows_here {
        #[unroll]
        for n in 0..d / 8 {
            let o1 = o_acc[n * 2 + 1];
            let base1 = (wrow + g as usize + 8) * d + n * 8 + col;
            o_sh[base1] = W::reinterpret(o1.extract(0usize));
            o_sh[base1 + 1] = W::reinterpret(o1.extract(1usize));
        }
    }
    if t == 0 {
        st_sh[(wrow + g as usize) * 2] = W::reinterpret(rows.m0);
        st_sh[(wrow + g as usize) * 2 + 1] = W::reinterpret(l0);
        st_sh[(wrow + g as usize + 8) * 2] = W::reinterpret(rows.m1);
        st_sh[(wrow + g as usize + 8) * 2 + 1] = W::reinterpret(l1);
    }
}

/// Launches the decode kernel on cubes of `(split, KV head, sequence x 16-row block)`: where the
/// GPU has thread-block clusters and the keys are few enough for one cluster's splits
/// ([`Split::new`]), [`split_kv_mma_cluster_kernel`], which merges its own splits;
/// otherwise [`split_kv_mma_kernel`] with the keys split for about `target` cubes, then, when
/// they are split, the merge kernel, or their own merge where they all fit the GPU at once
/// ([`SplitKvMmaBlueprint::merge`]). With `rope` (one query of one sequence, `p.q` the first
/// `Hq · D` elements of `rope.qkv`) the kernel applies RoPE and appends the newest key and value
/// itself ([`SplitKvMmaBlueprint::rope`]).
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
    if blueprint.stage_merge && !blueprint.merge_fits_stages(elem) {
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
    // no more cubes than SMs, one cube an SM at most), each streams enough keys
    // ([`OWN_MERGE_MIN_KEYS`]) and a workspace holds the counters.
    let counters = split.parts.counters().filter(|_| {
        split.partial()
            && !split.clustered
            && blueprint.trigger
            && split.chunk >= OWN_MERGE_MIN_KEYS
    });
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
    // Both kernels take the same arguments, the plain one the counters too.
    macro_rules! launch_on {
        ($kernel:ident $(, $counters:expr)?) => {
            $kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                split.buffers_reading(q, p, len_t),
                split.geometry(p),
                RopeTablesLaunch::new(cos.as_buffer_arg(), sin.as_buffer_arg(), rows as u32),
                $($counters,)?
                blueprint,
                dtype,
            )
        };
    }
    // SAFETY: the kernels read and write within the validated shapes of `p`, the partials the
    // split was sized with and the workspace's counters (one a (sequence, KV head, row block),
    // left at zero); without them the counter argument is never touched.
    unsafe {
        if split.clustered {
            launch_on!(split_kv_mma_cluster_kernel);
        } else {
            launch_on!(
                split_kv_mma_kernel,
                counters.unwrap_or(stats).as_buffer_arg()
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

    /// Eight planes keep their merge buffers in the stages (the 32k cube at 144 KB of shared
    /// memory, not 211); four planes keep buffers of their own unless that would not fit the
    /// budget (99 KB a cube on sm_86 and sm_89), where they move into the stages.
    #[test]
    fn merge_buffers_move_into_the_stages_for_eight_planes_or_a_small_budget() {
        let (h100, small) = (227 * 1024, 99 * 1024);
        let wide = SplitKvTiling {
            warps: 8,
            bk: 128,
            cubes_per_sm: 1,
        };
        let bp = SplitKvMmaBlueprint::new(128, wide, true, true).fitting(2, h100);
        assert!(bp.stage_merge);
        assert!(bp.shared_bytes(2) < 150 * 1024, "{}", bp.shared_bytes(2));
        let own = SplitKvMmaBlueprint::new(128, SplitKvTiling::default(), true, true);
        assert!(!own.stage_merge && own.shared_bytes(2) > small);
        assert!(!own.fitting(2, h100).stage_merge);
        let staged = own.fitting(2, small);
        assert!(staged.stage_merge && staged.shared_bytes(2) <= small);
        assert_eq!(
            own.shared_bytes(2) - staged.shared_bytes(2),
            4 * 16 * (128 + 2) * 4
        );
    }
}
