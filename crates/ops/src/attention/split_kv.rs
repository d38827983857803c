//! Flash-decoding with plane shuffles: few queries against a long KV sequence.
//!
//! One query row per cube would read each K/V row `Hq / Hkv` times and leave most of the device
//! idle, so instead the keys are split across cubes (`split` along x) and every cube handles all
//! query heads of one KV head (`hk` along y): the `Lq * Hq / Hkv` rows share each K/V load, so the
//! cache is read once per token. Each cube writes an unnormalised partial `(acc, max, sum)` and
//! the merge kernel combines them. With a single split the cube normalises and writes the output
//! itself (no merge launch).
//!
//! Inside a cube, `lpk = D / N` units hold one key row as `N`-wide (16-byte) vectors; the
//! partial dot products are summed with plane shuffles, so this kernel needs plane operations
//! (runtimes without them decode with the portable tiled kernel, which splits keys the same way).

use cubecl::prelude::*;

use super::geometry::{kv_first_row, kv_len, partial_rows, visible_keys, Geometry, SplitBuffers};
use super::plan::Problem;
use super::workspace::Split;
use crate::online_softmax::{exp_or_zero, EMPTY_MAX};
use crate::reduce::vector_sum;
use crate::{DeviceTensor, Result};

/// The comptime shape of [`split_kv_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SplitKvBlueprint {
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

impl SplitKvBlueprint {
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
pub(crate) fn split_kv_kernel<F: Float, N: Size>(
    mut io: SplitBuffers<Vector<F, N>, Vector<f32, N>>,
    geo: Geometry,
    #[comptime] blueprint: SplitKvBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let lpk = comptime![blueprint.lpk()];
    let rows = comptime![blueprint.rows];
    let unroll = comptime![blueprint.unroll];
    let slots = comptime![blueprint.units / blueprint.lpk()];
    let empty = f32::new(EMPTY_MAX);

    let c = UNIT_POS as usize % lpk;
    let slot = UNIT_POS / lpk as u32;
    let split = CUBE_POS_X;
    let hk = CUBE_POS_Y;
    let b = CUBE_POS_Z / geo.row_blocks;
    let rb = CUBE_POS_Z % geo.row_blocks;
    let len = kv_len(&io.len_buf, &geo, b, blueprint.device_len);
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
        qv[r] = Vector::<f32, N>::cast_from(io.q[qi]) * Vector::new(geo.scale);
        lim[r] = max(
            min(split_end, visible_keys(i, len, geo.lq, blueprint.causal)),
            k_begin,
        );
        k_end = max(k_end, lim[r]);
        m[r] = empty;
        l[r] = 0f32;
        acc[r] = Vector::new(0f32);
    }

    let kv_stride = geo.hkv as usize * lpk;
    let kv_base = kv_first_row(&io.len_buf, &geo, b) as usize * kv_stride + hk as usize * lpk + c;
    let mut kr = Array::<Vector<F, N>>::new(unroll);
    let mut vr = Array::<Vector<F, N>>::new(unroll);
    let mut s = Array::<f32>::new(comptime![unroll * rows]);

    for kb in range_stepped(k_begin, k_end, comptime![(slots * unroll) as u32]) {
        // All loads first, so that `2 * unroll` 16-byte reads per unit are in flight. Keys past
        // the range are clamped to the last one in range (finite data, masked below).
        #[unroll]
        for u in 0..unroll {
            let j = min(kb + (u * slots) as u32 + slot, k_end - 1) as usize;
            kr[u] = io.k[kv_base + j * kv_stride];
            vr[u] = io.v[kv_base + j * kv_stride];
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
    for st in comptime![lpk.trailing_zeros()]..comptime![blueprint.plane.trailing_zeros()] {
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
    let planes = comptime![blueprint.units / blueprint.plane];
    let plane_idx = UNIT_POS as usize / comptime![blueprint.plane];
    let lane = UNIT_POS as usize % comptime![blueprint.plane];
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
            if comptime![blueprint.partial] {
                let rows_out = partial_rows(&geo);
                let prow = split as usize * rows_out + orow;
                io.part_acc[prow * lpk + cc] = aa;
                if cc == 0 {
                    io.part_stats[prow * 2] = mm;
                    io.part_stats[prow * 2 + 1] = ll;
                }
            } else {
                let inv = select(ll > 0f32, 1f32 / ll, 0f32);
                io.out[orow * lpk + cc] = Vector::<F, N>::cast_from(aa * Vector::new(inv));
            }
        }
    }
}

/// Launches [`split_kv_kernel`] on cubes of `(split, KV head, sequence x row block)`, the keys
/// split for about `target` cubes, then the merge when they are split.
pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    len_t: &DeviceTensor<R>,
    mut blueprint: SplitKvBlueprint,
    target: usize,
) -> Result<()> {
    let split = Split::new(
        client,
        op,
        p,
        blueprint.rows,
        blueprint.keys_per_step(),
        target,
        false,
    )?;
    blueprint.partial = split.partial();
    unsafe {
        split_kv_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(
                split.splits as u32,
                p.hkv as u32,
                (p.batch * split.row_blocks) as u32,
            ),
            CubeDim::new_1d(blueprint.units as u32),
            blueprint.n,
            split.buffers(p, len_t),
            split.geometry(p),
            blueprint,
            p.q.dtype().elem_type(),
        );
    }
    split.finish(client, p);
    Ok(())
}
