//! Tiled GEMM without tensor cores (the path of runtimes without `cmma`, and of f32):
//! `y = x·wᵀ (+ bias) (+ residual)` or the gated `act(x·gateᵀ) * (x·upᵀ)`.
//!
//! Triton-style: each cube owns a `BM x BN` tile of y, walks K in `BK` steps staging the x and
//! w tiles through shared memory (transposed, so the inner loop reads both with unit stride),
//! and each unit accumulates a `TM x TN` register micro-tile in f32. Tiles are visited in
//! groups of `GROUP_M` tile-rows so that concurrently running cubes share their w tiles in L2.

use cubecl::prelude::*;

use super::Problem;
use crate::gemm::{cube_tile_origin, load_tile_transposed, write_epilogue, EpilogueBlueprint};

/// Comptime configuration (the kernel's compile key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TiledBlueprint {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
    pub group_m: u32,
    /// Gated (`epilogue.gate`): a second weight tile and `act(g) * u` in the epilogue.
    pub epilogue: EpilogueBlueprint,
}

impl TiledBlueprint {
    /// The tile every launch uses: 64x64, BK = 16, 4x4 outputs per unit, groups of 8 tile-rows.
    pub fn new(epilogue: EpilogueBlueprint) -> Self {
        Self {
            bm: 64,
            bn: 64,
            bk: 16,
            tm: 4,
            tn: 4,
            group_m: 8,
            epilogue,
        }
    }

    pub fn units(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    fn gated(&self) -> bool {
        self.epilogue.is_gated()
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
    #[comptime] plan: TiledBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let (m0, n0) = cube_tile_origin(m, n, plan.bm, plan.bn, plan.group_m);
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
        load_tile_transposed::<F>(x, &mut xs, m0, k0, m, k, plan.bm, plan.bk, units);
        load_tile_transposed::<F>(w, &mut ws, n0, k0, n, k, plan.bn, plan.bk, units);
        if comptime![plan.gated()] {
            load_tile_transposed::<F>(
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
                if comptime![plan.gated()] {
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
                    if comptime![plan.gated()] {
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
                let y = acc[(i * plan.tn + j) as usize];
                let up = if comptime![plan.gated()] {
                    acc_up[(i * plan.tn + j) as usize]
                } else {
                    f32::new(0.0)
                };
                write_epilogue::<F>(out, y, up, gm, gn, n, bias, residual, plan.epilogue);
            }
        }
    }
}

/// Launches the tiled GEMM on a validated problem.
pub(super) fn launch<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) {
    let bp = TiledBlueprint::new(p.epilogue());
    let tiles = p.m.div_ceil(bp.bm as usize) * p.n.div_ceil(bp.bn as usize);
    launch_dense!(tiled_gemm_kernel::<R>(
        client,
        crate::launch::cube_count_1d(client, tiles as u32),
        CubeDim::new_1d(bp.units()),
        p,
        [],
        [p.m, p.n, p.k, p.up_row_offset, bp, p.x.dtype().elem_type()]
    ));
}
