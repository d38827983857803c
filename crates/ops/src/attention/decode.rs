//! Flash-decoding: few queries against a long KV sequence.
//!
//! One query row per cube would read each K/V row `Hq / Hkv` times and leave most of the device
//! idle, so instead the keys are split across cubes (`split` along x) and every cube handles all
//! query heads of one KV head (`hk` along y): the `Lq * Hq / Hkv` rows share each K/V load, so the
//! cache is read once per token. Each cube writes an unnormalised partial `(acc, max, sum)` and
//! [`merge_kernel`] combines them. With a single split the cube normalises and writes the output
//! itself (no merge launch).
//!
//! Inside a cube, `lpk = D / N` units hold one key row as `N`-wide (16-byte) vectors; the
//! partial dot products are summed with plane shuffles, so this kernel needs plane operations
//! (runtimes without them decode with the portable tiled kernel, which splits keys the same way).

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::barrier::{copy_async, Barrier};
use cubecl::prelude::*;

use super::prefill::{copy_rows_async, exp2_approx, geometry, kv_len, visible_keys};
use crate::online_softmax::{exp_or_zero, EMPTY_MAX};
use crate::reduce::{cube_sum, vector_sum, ReducePlan};

/// The comptime shape of [`decode_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DecodeConfig {
    pub d: usize,
    /// Elements per vector load.
    pub n: usize,
    /// Query rows (query, head-of-group pairs) per cube.
    pub rows: usize,
    /// Key rows each unit loads per iteration (loads in flight).
    pub unroll: usize,
    /// Units per cube.
    pub units: usize,
    /// The plane size (fixed: the runtime reports one size).
    pub plane: usize,
    pub causal: bool,
    pub device_len: bool,
    pub partial: bool,
}

impl DecodeConfig {
    /// Units that hold one key row.
    pub fn lpk(&self) -> usize {
        self.d / self.n
    }

    /// Keys processed per cube iteration.
    pub fn keys_per_step(&self) -> usize {
        self.units / self.lpk() * self.unroll
    }

    pub fn shared_bytes(&self) -> usize {
        let planes = self.units / self.plane;
        planes * self.rows * (self.d + 2) * 4
    }
}

/// Merges two running `(max, sum, acc)` states.
#[cube]
fn merge_state<N: Size>(
    m: f32,
    l: f32,
    acc: Vector<f32, N>,
    mo: f32,
    lo: f32,
    acco: Vector<f32, N>,
) -> (f32, f32, Vector<f32, N>) {
    let m_new = max(m, mo);
    let a = exp_or_zero(m, m_new);
    let b = exp_or_zero(mo, m_new);
    (
        m_new,
        l * a + lo * b,
        acc * Vector::new(a) + acco * Vector::new(b),
    )
}

/// `plane_shuffle_xor` lane by lane (CUDA's `__shfl_xor_sync` has no vector overloads).
#[cube]
fn shuffle_xor_vector<N: Size>(v: Vector<f32, N>, #[comptime] mask: u32) -> Vector<f32, N> {
    let mut out = Vector::<f32, N>::empty();
    #[unroll]
    for i in 0..v.vector_size() {
        out.insert(i, plane_shuffle_xor(v.extract(i), mask));
    }
    out
}

#[cube(launch_unchecked)]
pub(crate) fn decode_kernel<F: Float, N: Size>(
    q: &[Vector<F, N>],
    k: &[Vector<F, N>],
    v: &[Vector<F, N>],
    len_buf: &[u32],
    out: &mut [Vector<F, N>],
    part_acc: &mut [Vector<f32, N>],
    part_stats: &mut [f32],
    len_host: u32,
    lq: u32,
    hq: u32,
    hkv: u32,
    group: u32,
    kv_rows: u32,
    chunk: u32,
    splits: u32,
    row_blocks: u32,
    scale: f32,
    #[comptime] cfg: DecodeConfig,
    #[define(F)] _dtype: ElemType,
) {
    let geo = geometry(
        len_host, lq, hq, hkv, group, kv_rows, chunk, splits, row_blocks, scale,
    );
    let lpk = comptime![cfg.lpk()];
    let rows = comptime![cfg.rows];
    let unroll = comptime![cfg.unroll];
    let slots = comptime![cfg.units / cfg.lpk()];
    let empty = f32::new(EMPTY_MAX);

    let c = UNIT_POS as usize % lpk;
    let slot = UNIT_POS / lpk as u32;
    let split = CUBE_POS_X;
    let hk = CUBE_POS_Y;
    let b = CUBE_POS_Z / geo.row_blocks;
    let rb = CUBE_POS_Z % geo.row_blocks;
    let len = kv_len(len_buf, &geo, cfg.device_len);
    let rows_total = geo.lq * geo.group;

    let k_begin = split * geo.chunk;
    let split_end = min(k_begin + geo.chunk, len);

    let mut qv = Array::<Vector<f32, N>>::new(rows);
    let mut lim = Array::<u32>::new(rows);
    let mut m = Array::<f32>::new(rows);
    let mut l = Array::<f32>::new(rows);
    let mut acc = Array::<Vector<f32, N>>::new(rows);
    let mut k_end = k_begin;
    #[unroll]
    for r in 0..rows {
        let rho = min(rb * rows as u32 + r as u32, rows_total - 1);
        let i = rho / geo.group;
        let h = hk * geo.group + rho % geo.group;
        let qi = ((b * geo.lq + i) * geo.hq + h) as usize * lpk + c;
        qv[r] = Vector::<f32, N>::cast_from(q[qi]) * Vector::new(geo.scale);
        lim[r] = max(
            min(split_end, visible_keys(i, len, geo.lq, cfg.causal)),
            k_begin,
        );
        k_end = max(k_end, lim[r]);
        m[r] = empty;
        l[r] = 0f32;
        acc[r] = Vector::new(0f32);
    }

    let kv_stride = geo.hkv as usize * lpk;
    let kv_base = (b * geo.kv_rows) as usize * kv_stride + hk as usize * lpk + c;
    let mut kr = Array::<Vector<F, N>>::new(unroll);
    let mut vr = Array::<Vector<F, N>>::new(unroll);
    let mut s = Array::<f32>::new(comptime![unroll * rows]);

    for kb in range_stepped(k_begin, k_end, comptime![(slots * unroll) as u32]) {
        // All loads first, so that `2 * unroll` 16-byte reads per unit are in flight. Keys past
        // the range are clamped to the last one in range (finite data, masked below).
        #[unroll]
        for u in 0..unroll {
            let j = min(kb + (u * slots) as u32 + slot, k_end - 1) as usize;
            kr[u] = k[kv_base + j * kv_stride];
            vr[u] = v[kv_base + j * kv_stride];
        }
        #[unroll]
        for u in 0..unroll {
            let kf = Vector::<f32, N>::cast_from(kr[u]);
            let j = kb + (u * slots) as u32 + slot;
            #[unroll]
            for r in 0..rows {
                let mut x = vector_sum::<f32, N>(qv[r] * kf);
                #[unroll]
                for st in 0..comptime![lpk.trailing_zeros()] {
                    x += plane_shuffle_xor(x, comptime![1u32 << st]);
                }
                s[u * rows + r] = select(j < lim[r], x, empty);
            }
        }
        #[unroll]
        for r in 0..rows {
            let mut m_tile = empty;
            #[unroll]
            for u in 0..unroll {
                m_tile = max(m_tile, s[u * rows + r]);
            }
            let m_new = max(m[r], m_tile);
            let alpha = exp_or_zero(m[r], m_new);
            let mut lr = l[r] * alpha;
            let mut ar = acc[r] * Vector::new(alpha);
            #[unroll]
            for u in 0..unroll {
                let x = s[u * rows + r];
                let p = exp_or_zero(x, m_new);
                lr += p;
                ar += Vector::<f32, N>::cast_from(vr[u]) * Vector::new(p);
            }
            m[r] = m_new;
            l[r] = lr;
            acc[r] = ar;
        }
    }

    // Combine the key slots of a plane (lanes `lpk` apart hold the same dims of other keys)...
    #[unroll]
    for st in comptime![lpk.trailing_zeros()]..comptime![cfg.plane.trailing_zeros()] {
        let mask = comptime![1u32 << st];
        #[unroll]
        for r in 0..rows {
            let mo = plane_shuffle_xor(m[r], mask);
            let lo = plane_shuffle_xor(l[r], mask);
            let ao = shuffle_xor_vector::<N>(acc[r], mask);
            let (m2, l2, a2) = merge_state::<N>(m[r], l[r], acc[r], mo, lo, ao);
            m[r] = m2;
            l[r] = l2;
            acc[r] = a2;
        }
    }

    // ...then the planes, through shared memory.
    let planes = comptime![cfg.units / cfg.plane];
    let plane_idx = UNIT_POS as usize / comptime![cfg.plane];
    let lane = UNIT_POS as usize % comptime![cfg.plane];
    let mut acc_sh = Shared::<[Vector<f32, N>]>::new_slice(comptime![planes * rows * lpk]);
    let mut st_sh = Shared::<[f32]>::new_slice(comptime![planes * rows * 2]);
    if lane < lpk {
        #[unroll]
        for r in 0..rows {
            acc_sh[(plane_idx * rows + r) * lpk + c] = acc[r];
            if c == 0 {
                st_sh[(plane_idx * rows + r) * 2] = m[r];
                st_sh[(plane_idx * rows + r) * 2 + 1] = l[r];
            }
        }
    }
    sync_cube();

    let u = UNIT_POS as usize;
    if u < comptime![rows * lpk] {
        let r = u / lpk;
        let cc = u % lpk;
        let rho = rb * rows as u32 + r as u32;
        if rho < rows_total {
            let mut mm = empty;
            let mut ll = 0f32;
            let mut aa = Vector::<f32, N>::new(0f32);
            #[unroll]
            for p in 0..planes {
                let (m2, l2, a2) = merge_state::<N>(
                    mm,
                    ll,
                    aa,
                    st_sh[(p * rows + r) * 2],
                    st_sh[(p * rows + r) * 2 + 1],
                    acc_sh[(p * rows + r) * lpk + cc],
                );
                mm = m2;
                ll = l2;
                aa = a2;
            }
            let i = rho / geo.group;
            let h = hk * geo.group + rho % geo.group;
            let orow = ((b * geo.lq + i) * geo.hq + h) as usize;
            if comptime![cfg.partial] {
                let rows_out = (CUBE_COUNT_Z / geo.row_blocks * geo.lq * geo.hq) as usize;
                let prow = split as usize * rows_out + orow;
                part_acc[prow * lpk + cc] = aa;
                if cc == 0 {
                    part_stats[prow * 2] = mm;
                    part_stats[prow * 2 + 1] = ll;
                }
            } else {
                let inv = select(ll > 0f32, 1f32 / ll, 0f32);
                out[orow * lpk + cc] = Vector::<F, N>::cast_from(aa * Vector::new(inv));
            }
        }
    }
}

/// The maximum of `value` over the cube, like [`crate::reduce::cube_max`] but starting from
/// [`EMPTY_MAX`] instead of `-inf` (which WGSL cannot spell; `cube_max` fails to compile on wgpu).
#[cube]
fn cube_max_finite(value: f32, #[comptime] plan: ReducePlan) -> f32 {
    let mut out = f32::new(EMPTY_MAX);
    if comptime![plan.use_plane] {
        let partial = plane_max(value);
        let mut shared = Shared::<[f32]>::new_slice(comptime![plan.max_planes() as usize]);
        if UNIT_POS_PLANE == 0 {
            shared[PLANE_POS as usize] = partial;
        }
        sync_cube();
        for i in 0..CUBE_DIM / PLANE_DIM {
            out = max(out, shared[i as usize]);
        }
    } else {
        let mut shared = Shared::<[f32]>::new_slice(comptime![plan.cube_dim as usize]);
        shared[UNIT_POS as usize] = value;
        sync_cube();
        #[unroll]
        for step in 0..plan.tree_steps() {
            let stride = comptime![(plan.cube_dim >> (step + 1)) as usize];
            if (UNIT_POS as usize) < stride {
                let other = shared[UNIT_POS as usize + stride];
                shared[UNIT_POS as usize] = max(shared[UNIT_POS as usize], other);
            }
            sync_cube();
        }
        out = shared[0];
    }
    out
}

/// The comptime shape of [`merge_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MergeConfig {
    pub d: usize,
    /// Units along the head dimension.
    pub lanes: usize,
    /// Groups of splits merged in parallel (the cube has `lanes * groups` units).
    pub groups: usize,
    /// Splits per group (unrolled, so that their loads are in flight together).
    pub per_group: usize,
    pub plan: ReducePlan,
}

impl MergeConfig {
    /// About one group per 4 splits, up to 32 groups (a 1024-unit cube).
    pub fn new<R: Runtime>(client: &ComputeClient<R>, d: usize, splits: usize) -> Self {
        let hw = &client.properties().hardware;
        let groups = (splits / 4)
            .min(hw.max_units_per_cube as usize / 32)
            .min(hw.max_shared_memory_size / (4 * (d + 2)))
            .clamp(1, 32);
        let groups = 1 << groups.ilog2();
        Self {
            d,
            lanes: 32,
            groups,
            per_group: splits.div_ceil(groups),
            plan: ReducePlan::new(client, (32 * groups) as u32),
        }
    }

    pub fn units(&self) -> u32 {
        (self.lanes * self.groups) as u32
    }
}

/// Combines the per-split partials of one output row (one cube per row): `out = Σ_s w_s acc_s /
/// Σ_s w_s sum_s` with `w_s = exp(max_s - max)`. Splits that saw no key (max = EMPTY_MAX) weigh
/// 0. First the cube reduces the split statistics (max, then the weighted sum), then each unit
/// adds its `per_group` splits with all their loads issued together: the kernel is a few
/// dependent memory latencies long, whatever the split count.
#[cube(launch_unchecked)]
pub(crate) fn merge_kernel<F: Float>(
    part_acc: &[f32],
    part_stats: &[f32],
    out: &mut [F],
    splits: u32,
    rows_out: u32,
    #[comptime] cfg: MergeConfig,
    #[define(F)] _dtype: ElemType,
) {
    let d = comptime![cfg.d];
    let lanes = comptime![cfg.lanes];
    let groups = comptime![cfg.groups];
    let dpl = comptime![cfg.d.div_ceil(cfg.lanes)];
    let row = min(CUBE_POS, rows_out as usize - 1);
    let rows = rows_out as usize;
    let lane = UNIT_POS as usize % lanes;
    let grp = UNIT_POS as usize / lanes;
    let empty = f32::new(EMPTY_MAX);
    let units = comptime![cfg.lanes * cfg.groups];

    // The statistics of up to `units * per_group` splits, unit u taking splits u, u + units, ..
    let mut m_local = empty;
    #[unroll]
    for i in 0..comptime![cfg.per_group.div_ceil(cfg.lanes)] {
        let s = UNIT_POS as usize + i * units;
        if s < splits as usize {
            m_local = max(m_local, part_stats[(s * rows + row) * 2]);
        }
    }
    let m = cube_max_finite(m_local, cfg.plan);
    let mut l_local = 0f32;
    #[unroll]
    for i in 0..comptime![cfg.per_group.div_ceil(cfg.lanes)] {
        let s = UNIT_POS as usize + i * units;
        if s < splits as usize {
            let st = (s * rows + row) * 2;
            l_local += part_stats[st + 1] * exp_or_zero(part_stats[st], m);
        }
    }
    let l = cube_sum(l_local, cfg.plan);

    let mut acc = Array::<f32>::new(dpl);
    #[unroll]
    for t in 0..dpl {
        acc[t] = 0f32;
    }
    #[unroll]
    for i in 0..comptime![cfg.per_group] {
        let s = grp + i * groups;
        if s < splits as usize {
            let prow = s * rows + row;
            let w = exp_or_zero(part_stats[prow * 2], m);
            #[unroll]
            for t in 0..dpl {
                let dd = lane + t * lanes;
                if comptime![(t + 1) * lanes <= d] || dd < d {
                    acc[t] += part_acc[prow * d + dd] * w;
                }
            }
        }
    }

    let mut acc_sh = Shared::<[f32]>::new_slice(comptime![groups * d]);
    #[unroll]
    for t in 0..dpl {
        let dd = lane + t * lanes;
        if comptime![(t + 1) * lanes <= d] || dd < d {
            acc_sh[grp * d + dd] = acc[t];
        }
    }
    sync_cube();

    if grp == 0 && CUBE_POS < rows {
        let inv = select(l > 0f32, 1f32 / l, 0f32);
        #[unroll]
        for t in 0..dpl {
            let dd = lane + t * lanes;
            if comptime![(t + 1) * lanes <= d] || dd < d {
                let mut a = 0f32;
                #[unroll]
                for g in 0..groups {
                    a += acc_sh[g * d + dd];
                }
                out[row * d + dd] = F::cast_from(a * inv);
            }
        }
    }
}

/// The comptime shape of [`mma_decode_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MmaDecodeConfig {
    pub d: usize,
    /// Planes per cube; each takes `bk / warps` keys of every tile.
    pub warps: usize,
    /// Keys per K/V tile (loaded by the whole cube).
    pub bk: usize,
    pub causal: bool,
    pub device_len: bool,
    pub partial: bool,
}

impl MmaDecodeConfig {
    pub fn new(d: usize, causal: bool, device_len: bool) -> Self {
        Self {
            d,
            warps: 4,
            bk: 64,
            causal,
            device_len,
            partial: false,
        }
    }

    pub fn stride(&self) -> usize {
        self.d + 8
    }

    /// Keys each plane handles per tile.
    pub fn wk(&self) -> usize {
        self.bk / self.warps
    }

    pub fn shared_bytes(&self, elem: usize) -> usize {
        (16 + 4 * self.bk) * self.stride() * elem + self.warps * 16 * (self.d + 2) * 4 + 64
    }
}

/// Flash-decoding on tensor cores. The `Lq * Hq / Hkv` query rows of one KV head (the GQA group,
/// times the few queries) form one 16-row `mma` tile, so each K/V row is read once for all of
/// them; the keys of the cube's split stream through shared memory in `bk`-key tiles
/// (`cp.async`, double-buffered), and the planes share each tile (plane `w` takes keys
/// `w * bk / warps ..`), merging their softmax states at the end. Per key the work is two `mma`s
/// per plane and a few ALU instructions per lane, so the kernel is bound by reading K/V.
#[cube(launch_unchecked)]
pub(crate) fn mma_decode_kernel<F: Float>(
    q: &[F],
    k: &[F],
    v: &[F],
    len_buf: &[u32],
    out: &mut [F],
    part_acc: &mut [f32],
    part_stats: &mut [f32],
    len_host: u32,
    lq: u32,
    hq: u32,
    hkv: u32,
    group: u32,
    kv_rows: u32,
    chunk: u32,
    splits: u32,
    row_blocks: u32,
    scale: f32,
    #[comptime] cfg: MmaDecodeConfig,
    #[define(F)] _dtype: ElemType,
) {
    let geo = geometry(
        len_host, lq, hq, hkv, group, kv_rows, chunk, splits, row_blocks, scale,
    );
    let d = comptime![cfg.d];
    let bk = comptime![cfg.bk];
    let wk = comptime![cfg.wk()];
    let warps = comptime![cfg.warps];
    let stride = comptime![cfg.stride()];
    let dk = comptime![cfg.d / 16];
    let nk = comptime![cfg.wk() / 8];
    let dn = comptime![cfg.d / 8];
    let kk_n = comptime![cfg.wk() / 16];
    let empty = f32::new(EMPTY_MAX);
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
    let len = kv_len(len_buf, &geo, cfg.device_len);
    let rows_total = geo.lq * geo.group;

    // Rows of the tile: (query i, head hk * group + gg) for rho = rb * 16 + r.
    let first_rho = rb * 16;
    let last_rho = min(first_rho + 15, rows_total - 1);
    let k_begin = split * geo.chunk;
    let split_end = min(k_begin + geo.chunk, len);
    let k_end = max(
        min(
            split_end,
            visible_keys(last_rho / geo.group, len, geo.lq, cfg.causal),
        ),
        k_begin,
    );
    let k_unmasked = min(
        split_end,
        visible_keys(first_rho / geo.group, len, geo.lq, cfg.causal),
    );
    let n_tiles = (k_end - k_begin).div_ceil(bk as u32);

    let mut q_sh = Shared::<[F]>::new_aligned_slice(comptime![16 * stride], 16usize);
    let mut k_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let mut v_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let bar0 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);
    let bar1 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let kv_stride = (geo.hkv as usize) * d;
    let kv_base = (b * geo.kv_rows) as usize * kv_stride + hk as usize * d;
    let last_key = k_end.saturating_sub(1) as usize;

    // Q rows gathered from their heads (16-byte copies).
    let per_row = comptime![d / 8];
    for e in range_stepped(UNIT_POS as usize, comptime![16 * d / 8], CUBE_DIM as usize) {
        let r = e / per_row;
        let col = (e % per_row) * 8;
        let rho = min(first_rho + r as u32, rows_total - 1);
        let qrow = (b * geo.lq + rho / geo.group) * geo.hq + hk * geo.group + rho % geo.group;
        let s = qrow as usize * d + col;
        let dst = r * stride + col;
        copy_async(&q[s..s + 8], &mut q_sh[dst..dst + 8], 8u32);
    }
    if n_tiles > 0 {
        let src = kv_base + k_begin as usize * kv_stride;
        let last = last_key - k_begin as usize;
        copy_rows_async::<F>(k, &mut k_sh, src, kv_stride, last, 0usize, bk, d, stride);
        copy_rows_async::<F>(v, &mut v_sh, src, kv_stride, last, 0usize, bk, d, stride);
    }
    bar0.commit_copy_async();
    bar0.arrive_and_wait();

    let lrow = (lane % 8 + 8 * ((lane / 8) % 2)) as usize;
    let lcol = (8 * (lane / 16)) as usize;
    let mut q_frag = Array::<Vector<F, NA>>::new(comptime![dk * 4]);
    #[unroll]
    for cc in 0..dk {
        let start = lrow * stride + cc * 16 + lcol;
        let regs = def.load_matrix::<F, NA>(&q_sh[start..start + 8], MatrixIdent::A, 4usize, false);
        #[unroll]
        for r in 0..4usize {
            q_frag[cc * 4 + r] = regs[r];
        }
    }

    let mut o_acc = Array::<Vector<f32, NC>>::new(comptime![dn * 2]);
    #[unroll]
    for n in 0..comptime![dn * 2] {
        o_acc[n] = Vector::new(0f32);
    }
    let mut s_acc = Array::<Vector<f32, NC>>::new(comptime![nk * 2]);
    let mut m0 = empty;
    let mut m1 = empty;
    let mut l0 = 0f32;
    let mut l1 = 0f32;
    let rho0 = min(first_rho + g, rows_total - 1);
    let rho1 = min(first_rho + g + 8, rows_total - 1);
    let lim0 = min(
        split_end,
        visible_keys(rho0 / geo.group, len, geo.lq, cfg.causal),
    );
    let lim1 = min(
        split_end,
        visible_keys(rho1 / geo.group, len, geo.lq, cfg.causal),
    );
    let mk = (lane / 8) as usize;
    let k_lrow = 8 * (mk / 2) + (lane % 8) as usize;
    let k_lcol = 8 * (mk % 2);
    let v_lrow = 8 * (mk % 2) + (lane % 8) as usize;
    let v_lcol = 8 * (mk / 2);
    let wkey = warp as usize * wk;

    for kt in 0..n_tiles {
        let buf = (kt % 2) as usize;
        if kt + 1 < n_tiles {
            let nb = comptime![bk * stride] * (1 - buf);
            let first = k_begin as usize + ((kt + 1) * bk as u32) as usize;
            let src = kv_base + first * kv_stride;
            let last = last_key - first;
            copy_rows_async::<F>(k, &mut k_sh, src, kv_stride, last, nb, bk, d, stride);
            copy_rows_async::<F>(v, &mut v_sh, src, kv_stride, last, nb, bk, d, stride);
            if buf == 0 {
                bar1.commit_copy_async();
            } else {
                bar0.commit_copy_async();
            }
        }
        if kt > 0 {
            if buf == 0 {
                bar0.arrive_and_wait();
            } else {
                bar1.arrive_and_wait();
            }
        }
        let kbuf = buf * comptime![bk * stride] + wkey * stride;

        #[unroll]
        for j in 0..comptime![nk * 2] {
            s_acc[j] = Vector::new(0f32);
        }
        #[unroll]
        for cc in 0..dk {
            let mut a = Array::<Vector<F, NA>>::new(4usize);
            #[unroll]
            for r in 0..4usize {
                a[r] = q_frag[cc * 4 + r];
            }
            #[unroll]
            for jj in 0..comptime![nk / 2] {
                let start = kbuf + (jj * 16 + k_lrow) * stride + cc * 16 + k_lcol;
                let regs = def.load_matrix::<F, NB>(
                    &k_sh[start..start + 8],
                    MatrixIdent::B,
                    4usize,
                    false,
                );
                #[unroll]
                for half in 0..2usize {
                    let mut bb = Array::<Vector<F, NB>>::new(2usize);
                    bb[0] = regs[half * 2];
                    bb[1] = regs[half * 2 + 1];
                    let j = jj * 2 + half;
                    let mut acc = Array::<Vector<f32, NC>>::new(2usize);
                    acc[0] = s_acc[j * 2];
                    acc[1] = s_acc[j * 2 + 1];
                    def.execute_inplace(&a, &bb, &mut acc);
                    s_acc[j * 2] = acc[0];
                    s_acc[j * 2 + 1] = acc[1];
                }
            }
        }

        let key0 = k_begin + kt * bk as u32 + wkey as u32;
        let masked = key0 + wk as u32 > k_unmasked;
        let mut mx0 = empty;
        let mut mx1 = empty;
        #[unroll]
        for j in 0..nk {
            let mut v0 = s_acc[j * 2];
            let mut v1 = s_acc[j * 2 + 1];
            if masked {
                let key = key0 + (j * 8) as u32 + 2 * t;
                v0.insert(0usize, select(key < lim0, v0.extract(0usize), empty));
                v0.insert(1usize, select(key + 1 < lim0, v0.extract(1usize), empty));
                v1.insert(0usize, select(key < lim1, v1.extract(0usize), empty));
                v1.insert(1usize, select(key + 1 < lim1, v1.extract(1usize), empty));
                s_acc[j * 2] = v0;
                s_acc[j * 2 + 1] = v1;
            }
            mx0 = max(mx0, max(v0.extract(0usize), v0.extract(1usize)));
            mx1 = max(mx1, max(v1.extract(0usize), v1.extract(1usize)));
        }
        mx0 = max(mx0, plane_shuffle_xor(mx0, 1u32));
        mx0 = max(mx0, plane_shuffle_xor(mx0, 2u32));
        mx1 = max(mx1, plane_shuffle_xor(mx1, 1u32));
        mx1 = max(mx1, plane_shuffle_xor(mx1, 2u32));
        let mn0 = max(m0, mx0);
        let mn1 = max(m1, mx1);
        let mc0 = select(mn0 == empty, 0f32, mn0 * c);
        let mc1 = select(mn1 == empty, 0f32, mn1 * c);
        let alpha0 = exp2_approx(m0 * c - mc0);
        let alpha1 = exp2_approx(m1 * c - mc1);
        m0 = mn0;
        m1 = mn1;
        l0 *= alpha0;
        l1 *= alpha1;
        #[unroll]
        for n in 0..dn {
            o_acc[n * 2] *= Vector::new(alpha0);
            o_acc[n * 2 + 1] *= Vector::new(alpha1);
        }
        #[unroll]
        for j in 0..nk {
            let v0 = s_acc[j * 2];
            let v1 = s_acc[j * 2 + 1];
            let mut p0 = Vector::<f32, NC>::empty();
            let mut p1 = Vector::<f32, NC>::empty();
            #[unroll]
            for e in 0..2usize {
                let e0 = exp2_approx(fma(v0.extract(e), c, -mc0));
                let e1 = exp2_approx(fma(v1.extract(e), c, -mc1));
                l0 += e0;
                l1 += e1;
                p0.insert(e, e0);
                p1.insert(e, e1);
            }
            s_acc[j * 2] = p0;
            s_acc[j * 2 + 1] = p1;
        }

        #[unroll]
        for kk in 0..kk_n {
            let mut a = Array::<Vector<F, NA>>::new(4usize);
            a[0] = Vector::<F, NA>::cast_from(s_acc[kk * 4]);
            a[1] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 1]);
            a[2] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 2]);
            a[3] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 3]);
            #[unroll]
            for np in 0..comptime![dn / 2] {
                let start = kbuf + (kk * 16 + v_lrow) * stride + np * 16 + v_lcol;
                let regs =
                    def.load_matrix::<F, NB>(&v_sh[start..start + 8], MatrixIdent::B, 4usize, true);
                #[unroll]
                for half in 0..2usize {
                    let n = np * 2 + half;
                    let mut bb = Array::<Vector<F, NB>>::new(2usize);
                    bb[0] = regs[half * 2];
                    bb[1] = regs[half * 2 + 1];
                    let mut acc = Array::<Vector<f32, NC>>::new(2usize);
                    acc[0] = o_acc[n * 2];
                    acc[1] = o_acc[n * 2 + 1];
                    def.execute_inplace(&a, &bb, &mut acc);
                    o_acc[n * 2] = acc[0];
                    o_acc[n * 2 + 1] = acc[1];
                }
            }
        }
        sync_cube();
    }

    // Merge the planes: each wrote (max, sum, acc) for the 16 rows over its keys.
    l0 += plane_shuffle_xor(l0, 1u32);
    l0 += plane_shuffle_xor(l0, 2u32);
    l1 += plane_shuffle_xor(l1, 1u32);
    l1 += plane_shuffle_xor(l1, 2u32);
    let mut o_sh = Shared::<[f32]>::new_slice(comptime![warps * 16 * d]);
    let mut st_sh = Shared::<[f32]>::new_slice(comptime![warps * 16 * 2]);
    let wrow = warp as usize * 16;
    let col = (2 * t) as usize;
    #[unroll]
    for n in 0..dn {
        let o0 = o_acc[n * 2];
        let o1 = o_acc[n * 2 + 1];
        let base0 = (wrow + g as usize) * d + n * 8 + col;
        let base1 = base0 + 8 * d;
        o_sh[base0] = o0.extract(0usize);
        o_sh[base0 + 1] = o0.extract(1usize);
        o_sh[base1] = o1.extract(0usize);
        o_sh[base1 + 1] = o1.extract(1usize);
    }
    if t == 0 {
        st_sh[(wrow + g as usize) * 2] = m0;
        st_sh[(wrow + g as usize) * 2 + 1] = l0;
        st_sh[(wrow + g as usize + 8) * 2] = m1;
        st_sh[(wrow + g as usize + 8) * 2 + 1] = l1;
    }
    sync_cube();

    for e in range_stepped(UNIT_POS as usize, comptime![16 * d], CUBE_DIM as usize) {
        let r = e / d;
        let dd = e % d;
        let rho = first_rho + r as u32;
        if rho < rows_total {
            let mut mm = empty;
            #[unroll]
            for w in 0..warps {
                mm = max(mm, st_sh[(w * 16 + r) * 2]);
            }
            let mc = select(mm == empty, 0f32, mm * c);
            let mut ll = 0f32;
            let mut acc = 0f32;
            #[unroll]
            for w in 0..warps {
                let f = exp2_approx(st_sh[(w * 16 + r) * 2] * c - mc);
                ll += st_sh[(w * 16 + r) * 2 + 1] * f;
                acc += o_sh[(w * 16 + r) * d + dd] * f;
            }
            let orow = ((b * geo.lq + rho / geo.group) * geo.hq + hk * geo.group + rho % geo.group)
                as usize;
            if comptime![cfg.partial] {
                let rows_out = (CUBE_COUNT_Z / geo.row_blocks * geo.lq * geo.hq) as usize;
                let prow = split as usize * rows_out + orow;
                part_acc[prow * d + dd] = acc;
                if dd == 0 {
                    // The merge works in natural units of the scaled scores.
                    part_stats[prow * 2] = select(
                        mm == empty,
                        empty,
                        mm * c * f32::new(core::f32::consts::LN_2),
                    );
                    part_stats[prow * 2 + 1] = ll;
                }
            } else {
                let inv = select(ll > 0f32, 1f32 / ll, 0f32);
                out[orow * d + dd] = F::cast_from(acc * inv);
            }
        }
    }
}
