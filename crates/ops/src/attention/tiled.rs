//! The portable flash-attention kernel: no plane operations, no tensor cores, any float dtype.
//! What wgpu and f32 run, and what decodes on runtimes without plane operations.
//!
//! A cube takes `br` rows (query, head-of-group pairs of one KV head) with `upr` units per row;
//! K/V tiles of `bk` keys go through shared memory, scores through a small shared tile, and the
//! online softmax runs per row (the `Lq x Lk` score matrix is never materialised). Long key
//! ranges are split across cubes (partials combined by the merge kernel) so that few-query
//! problems still fill the device.

use cubecl::prelude::*;

use super::geometry::{kv_first_row, kv_len, visible_keys, Geometry, SplitBuffers};
use super::plan::Problem;
use super::workspace::Split;
use crate::online_softmax::{exp_or_zero, EMPTY_MAX};
use crate::{DeviceTensor, Result};

/// The comptime shape of [`tiled_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TiledBlueprint {
    /// Head dimension.
    pub d: usize,
    /// Rows (query, head-of-group pairs) per cube.
    pub br: usize,
    /// Keys per shared-memory tile.
    pub bk: usize,
    /// Units cooperating on one row (the cube has `br * upr` units).
    pub upr: usize,
    pub causal: bool,
    /// Read the KV length from a device buffer instead of the `len_host` argument.
    pub device_len: bool,
    /// Write unnormalised partials (one per key split) instead of the output.
    pub partial: bool,
}

impl TiledBlueprint {
    pub fn units(&self) -> u32 {
        (self.br * self.upr) as u32
    }

    /// Dimensions each unit accumulates (`d` spread over the `upr` units of a row).
    pub fn dims_per_unit(&self) -> usize {
        self.d.div_ceil(self.upr)
    }

    /// Shared memory of one cube, in bytes.
    pub fn shared_bytes(&self, elem: usize) -> usize {
        (self.br * self.d + 2 * self.bk * self.d) * elem + self.br * self.bk * 4
    }
}

#[cube(launch_unchecked)]
pub(crate) fn tiled_kernel<F: Float>(
    mut io: SplitBuffers<F, f32>,
    geo: Geometry,
    #[comptime] blueprint: TiledBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let d = comptime![blueprint.d];
    let br = comptime![blueprint.br];
    let bk = comptime![blueprint.bk];
    let upr = comptime![blueprint.upr];
    let dpu = comptime![blueprint.dims_per_unit()];

    let r = UNIT_POS as usize / upr;
    let sub = UNIT_POS as usize % upr;
    let hk = CUBE_POS_Y;
    let split = CUBE_POS_Z % geo.splits;
    let b = CUBE_POS_Z / geo.splits;
    let len = kv_len(&io.len_buf, &geo, b, blueprint.device_len);

    // This unit's row: (query i, head h of the group of KV head hk). Rows past the end compute
    // on a clamped copy and never write.
    let rows_total = geo.lq * geo.group;
    let rho = CUBE_POS_X * br as u32 + r as u32;
    let row_valid = rho < rows_total;
    let rho_c = min(rho, rows_total - 1);
    let i = rho_c / geo.group;
    let h = hk * geo.group + rho_c % geo.group;
    let rho_last = min(CUBE_POS_X * br as u32 + br as u32 - 1, rows_total - 1);

    // Keys of this split that some row of the cube can see; fully masked tiles are never loaded.
    let k_begin = split * geo.chunk;
    let split_end = min(k_begin + geo.chunk, len);
    let k_end = min(
        split_end,
        visible_keys(rho_last / geo.group, len, geo.lq, blueprint.causal),
    );
    let row_end = min(split_end, visible_keys(i, len, geo.lq, blueprint.causal));

    let mut q_sh = Shared::<[F]>::new_slice(comptime![br * d]);
    let mut k_sh = Shared::<[F]>::new_slice(comptime![bk * d]);
    let mut v_sh = Shared::<[F]>::new_slice(comptime![bk * d]);
    let mut s_sh = Shared::<[f32]>::new_slice(comptime![br * bk]);

    let q_base = ((b * geo.lq + i) * geo.hq + h) as usize * d;
    for dd in range_stepped(sub, d, upr) {
        q_sh[r * d + dd] = io.q[q_base + dd];
    }

    let mut acc = Array::<f32>::new(dpu);
    #[unroll]
    for t in 0..dpu {
        acc[t] = 0f32;
    }
    let mut m = f32::new(EMPTY_MAX);
    let mut l = 0f32;
    let empty = f32::new(EMPTY_MAX);
    let kv_stride = (geo.hkv as usize) * d;
    let kv_base = kv_first_row(&io.len_buf, &geo, b) as usize * kv_stride + hk as usize * d;

    for kt in range_stepped(k_begin, k_end, bk as u32) {
        // Rows past the visible range are clamped to the last visible row: finite data whose
        // scores are masked below (a cache row past the length may hold anything, NaN included).
        for e in range_stepped(UNIT_POS as usize, comptime![bk * d], CUBE_DIM as usize) {
            let kk = e / d;
            let dd = e % d;
            let j = min(kt as usize + kk, k_end as usize - 1);
            k_sh[e] = io.k[kv_base + j * kv_stride + dd];
            v_sh[e] = io.v[kv_base + j * kv_stride + dd];
        }
        sync_cube();

        for kk in range_stepped(sub, bk, upr) {
            let mut s = 0f32;
            for dd in 0..d {
                s += f32::cast_from(q_sh[r * d + dd]) * f32::cast_from(k_sh[kk * d + dd]);
            }
            let j = kt + kk as u32;
            s_sh[r * bk + kk] = select(j < row_end, s * geo.scale, empty);
        }
        sync_cube();

        let mut m_tile = empty;
        for kk in 0..bk {
            m_tile = max(m_tile, s_sh[r * bk + kk]);
        }
        let m_new = max(m, m_tile);
        let alpha = exp_or_zero(m, m_new);
        l *= alpha;
        #[unroll]
        for t in 0..dpu {
            acc[t] *= alpha;
        }
        for kk in 0..bk {
            let s = s_sh[r * bk + kk];
            // A masked key contributes nothing.
            let p = exp_or_zero(s, m_new);
            l += p;
            #[unroll]
            for t in 0..dpu {
                let dd = sub + t * upr;
                if comptime![(t + 1) * upr <= d] || dd < d {
                    acc[t] += p * f32::cast_from(v_sh[kk * d + dd]);
                }
            }
        }
        m = m_new;
        sync_cube();
    }

    if row_valid {
        let orow = ((b * geo.lq + i) * geo.hq + h) as usize;
        if comptime![blueprint.partial] {
            let rows_out = (CUBE_COUNT_Z / geo.splits * geo.lq * geo.hq) as usize;
            let prow = split as usize * rows_out + orow;
            #[unroll]
            for t in 0..dpu {
                let dd = sub + t * upr;
                if comptime![(t + 1) * upr <= d] || dd < d {
                    io.part_acc[prow * d + dd] = acc[t];
                }
            }
            if sub == 0 {
                io.part_stats[prow * 2] = m;
                io.part_stats[prow * 2 + 1] = l;
            }
        } else {
            // A row that sees no key (device length below lq) gets zeros.
            let inv = select(l > 0f32, 1f32 / l, 0f32);
            #[unroll]
            for t in 0..dpu {
                let dd = sub + t * upr;
                if comptime![(t + 1) * upr <= d] || dd < d {
                    io.out[orow * d + dd] = F::cast_from(acc[t] * inv);
                }
            }
        }
    }
}

/// Launches [`tiled_kernel`] on cubes of `(row block, KV head, sequence x split)`, the keys split
/// for about `target` cubes, then the merge when they are split.
pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    len_t: &DeviceTensor<R>,
    mut blueprint: TiledBlueprint,
    target: usize,
) -> Result<()> {
    let split = Split::new(client, op, p, blueprint.br, blueprint.bk, target, false)?;
    blueprint.partial = split.partial();
    unsafe {
        tiled_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(
                split.row_blocks as u32,
                p.hkv as u32,
                (p.batch * split.splits) as u32,
            ),
            CubeDim::new_1d(blueprint.units()),
            split.buffers(p, len_t),
            split.geometry(p),
            blueprint,
            p.q.dtype().elem_type(),
        );
    }
    split.finish(client, p);
    Ok(())
}
