//! Tiled GEMM without tensor cores (the path of runtimes without `cmma`, and of f32):
//! `y = x·wᵀ (+ bias) (+ residual)` or the gated `act(x·gateᵀ) * (x·upᵀ)`.
//!
//! Triton-style: each cube owns a `BM x BN` tile of y, walks K in `BK` steps staging the x and
//! w tiles through shared memory (transposed, so the inner loop reads both with unit stride),
//! and each unit accumulates a `TM x TN` register micro-tile in f32. Tiles are visited in
//! groups of `GROUP_M` tile-rows so that concurrently running cubes share their w tiles in L2.

use cubecl::prelude::*;

use super::gemv::activation;

/// Comptime configuration (the kernel's compile key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TilePlan {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
    pub group_m: u32,
    pub has_bias: bool,
    pub has_residual: bool,
    pub gated: bool,
    pub gelu: bool,
}

impl TilePlan {
    pub fn units(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
}

/// The (tile-row, tile-column) visited by cube `pid` in grouped order.
#[cube]
pub(crate) fn grouped_tile(
    pid: usize,
    tiles_m: usize,
    tiles_n: usize,
    #[comptime] group_m: u32,
) -> (usize, usize) {
    let group = group_m as usize;
    let per_group = group * tiles_n;
    let first_m = (pid / per_group) * group;
    let size_m = min(tiles_m - first_m, group);
    let local = pid % per_group;
    (first_m + local % size_m, local / size_m)
}

/// Loads a `rows x bk` tile of a row-major `[rows_total, k]` matrix into shared memory,
/// transposed to `[bk][rows]`, zero-filling outside the matrix.
#[cube]
fn load_tile<F: Float>(
    src: &[F],
    dst: &mut [F],
    row0: usize,
    k0: usize,
    rows_total: usize,
    k: usize,
    #[comptime] rows: u32,
    #[comptime] bk: u32,
    #[comptime] units: u32,
) {
    let count = comptime![(rows * bk).div_ceil(units)];
    #[unroll]
    for i in 0..count {
        let idx = UNIT_POS as usize + i as usize * units as usize;
        if idx < comptime![(rows * bk) as usize] {
            let r = idx / bk as usize;
            let c = idx % bk as usize;
            let gr = row0 + r;
            let gc = k0 + c;
            let mut v = F::new(0.0);
            if gr < rows_total && gc < k {
                v = src[gr * k + gc];
            }
            dst[c * rows as usize + r] = v;
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tiled_gemm_kernel<F: Float>(
    x: &[F],
    w: &[F],
    w_up: &[F],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n: usize,
    k: usize,
    up_row_offset: usize,
    #[comptime] plan: TilePlan,
    #[define(F)] _dtype: ElemType,
) {
    let tiles_m = m.div_ceil(plan.bm as usize);
    let tiles_n = n.div_ceil(plan.bn as usize);
    if CUBE_POS >= tiles_m * tiles_n {
        terminate!();
    }
    let (tile_m, tile_n) = grouped_tile(CUBE_POS, tiles_m, tiles_n, plan.group_m);
    let m0 = tile_m * plan.bm as usize;
    let n0 = tile_n * plan.bn as usize;
    let tx = (UNIT_POS % (plan.bn / plan.tn)) as usize;
    let ty = (UNIT_POS / (plan.bn / plan.tn)) as usize;

    let mut xs = Shared::<[F]>::new_slice(comptime![(plan.bk * plan.bm) as usize]);
    let mut ws = Shared::<[F]>::new_slice(comptime![(plan.bk * plan.bn) as usize]);
    let mut us = Shared::<[F]>::new_slice(comptime![(plan.bk * plan.bn) as usize]);
    let acc_len = comptime![(plan.tm * plan.tn) as usize];
    let mut acc = Array::<f32>::new(acc_len);
    let mut acc_up = Array::<f32>::new(acc_len);
    #[unroll]
    for i in 0..acc_len {
        acc[i] = 0f32;
        acc_up[i] = 0f32;
    }
    let mut a = Array::<f32>::new(comptime![plan.tm as usize]);
    let mut b = Array::<f32>::new(comptime![plan.tn as usize]);
    let mut bu = Array::<f32>::new(comptime![plan.tn as usize]);
    let units = plan.units();

    for k0 in range_stepped(0, k, plan.bk as usize) {
        load_tile::<F>(x, &mut xs, m0, k0, m, k, plan.bm, plan.bk, units);
        load_tile::<F>(w, &mut ws, n0, k0, n, k, plan.bn, plan.bk, units);
        if comptime![plan.gated] {
            load_tile::<F>(
                w_up,
                &mut us,
                up_row_offset + n0,
                k0,
                up_row_offset + n,
                k,
                plan.bn,
                plan.bk,
                units,
            );
        }
        sync_cube();
        #[unroll]
        for kk in 0..plan.bk {
            #[unroll]
            for i in 0..plan.tm {
                a[i as usize] = f32::cast_from(
                    xs[(kk * plan.bm) as usize + ty * plan.tm as usize + i as usize],
                );
            }
            #[unroll]
            for j in 0..plan.tn {
                b[j as usize] = f32::cast_from(
                    ws[(kk * plan.bn) as usize + tx * plan.tn as usize + j as usize],
                );
                if comptime![plan.gated] {
                    bu[j as usize] = f32::cast_from(
                        us[(kk * plan.bn) as usize + tx * plan.tn as usize + j as usize],
                    );
                }
            }
            #[unroll]
            for i in 0..plan.tm {
                #[unroll]
                for j in 0..plan.tn {
                    acc[(i * plan.tn + j) as usize] += a[i as usize] * b[j as usize];
                    if comptime![plan.gated] {
                        acc_up[(i * plan.tn + j) as usize] += a[i as usize] * bu[j as usize];
                    }
                }
            }
        }
        sync_cube();
    }

    #[unroll]
    for i in 0..plan.tm {
        #[unroll]
        for j in 0..plan.tn {
            let gm = m0 + ty * plan.tm as usize + i as usize;
            let gn = n0 + tx * plan.tn as usize + j as usize;
            if gm < m && gn < n {
                let mut y = acc[(i * plan.tn + j) as usize];
                if comptime![plan.gated] {
                    let g = f32::cast_from(F::cast_from(y));
                    let u = f32::cast_from(F::cast_from(acc_up[(i * plan.tn + j) as usize]));
                    y = activation(g, plan.gelu) * u;
                }
                if comptime![plan.has_bias] {
                    y += f32::cast_from(bias[gn]);
                }
                if comptime![plan.has_residual] {
                    y += f32::cast_from(residual[gm * n + gn]);
                }
                out[gm * n + gn] = F::cast_from(y);
            }
        }
    }
}
