//! The end of the decode GEMVs whose tile is 16 weight rows on the MMA's A side (the int4 GEMV
//! `crate::w4a16_mma` and the 8-bit float-activation GEMV `crate::gemm8::float_x`): each warp's
//! partial sums through shared memory, summed over the tile's warps in warp order, scaled per
//! row and per column, and written with the epilogue.

use cubecl::prelude::*;
use ops::gemm::{write_epilogue, EpilogueBlueprint};

use crate::w4a16_mma::TILE_N;

/// The comptime layout of the partial sums: warps per tile, tiles per cube, halves (2 when
/// gated: the up sums), x halves (2 above 8 rows of x: a second MMA per fragment), rows of x.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TileSums {
    pub warps: u32,
    pub tiles: u32,
    pub halves: u32,
    pub x_halves: u32,
    pub m: u32,
}

impl TileSums {
    /// The layout of `warps` warps per tile and `tiles` tiles per cube for `m` rows of x, with
    /// the up sums when `gated`.
    pub fn new(m: u32, warps: u32, tiles: u32, gated: bool) -> Self {
        Self {
            warps,
            tiles,
            halves: if gated { 2 } else { 1 },
            x_halves: if m > 8 { 2 } else { 1 },
            m,
        }
    }

    /// f32s of one (tile, warp, half)'s outputs: 16 columns x 8 rows per x half.
    pub fn slot_len(&self) -> usize {
        TILE_N * 8 * self.x_halves as usize
    }

    /// f32s of the shared buffer [`stash_tile_sums`] fills.
    pub fn shared_len(&self) -> usize {
        (self.warps * self.tiles * self.halves) as usize * self.slot_len()
    }
}

/// Leaves lane `(gid, tig)` of warp `warp` of tile `tile` its sums in `red`:
/// `acc[4 (half · x_halves + xh) + e]` is weight row `gid + 8 (e / 2)`, x row
/// `8 xh + 2 tig + e % 2`; a slot per (tile, warp, half), x row major.
#[cube]
pub(crate) fn stash_tile_sums(
    red: &mut [f32],
    acc: &Array<f32>,
    tile: usize,
    warp: usize,
    #[comptime] s: TileSums,
) {
    let lane = (UNIT_POS % 32) as usize;
    let (gid, tig) = (lane / 4, lane % 4);
    let warps = comptime![s.warps as usize];
    let halves = comptime![s.halves as usize];
    let x_halves = comptime![s.x_halves as usize];
    let slot_len = comptime![s.slot_len()];
    #[unroll]
    for half in 0..halves {
        #[unroll]
        for xh in 0..x_halves {
            #[unroll]
            for e in 0..4usize {
                let nr = gid + 8 * (e / 2);
                let xr = 8 * xh + 2 * tig + e % 2;
                let slot = (tile * warps + warp) * halves + half;
                red[slot * slot_len + xr * TILE_N + nr] = acc[4 * (half * x_halves + xh) + e];
            }
        }
    }
}

/// After the barrier that follows [`stash_tile_sums`]: each output `(row, col)` of the cube's
/// tiles (tile group `group` of an `n`-column output) summed over its warps in warp order, with
/// `rows_scaled` multiplied by `row_scale[row]`, with `cols_scaled` by the column's weight scale
/// `col_scale[col]` (`col_scale[up_offset + col]` for the up sums), and written with the
/// epilogue.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_tile_sums<F: Float>(
    red: &[f32],
    out: &mut [F],
    bias: &[F],
    residual: &[F],
    row_scale: &Array<f32>,
    col_scale: &[f32],
    group: usize,
    n: usize,
    up_offset: usize,
    #[comptime] s: TileSums,
    #[comptime] rows_scaled: bool,
    #[comptime] cols_scaled: bool,
    #[comptime] epilogue: EpilogueBlueprint,
) {
    let warps = comptime![s.warps as usize];
    let halves = comptime![s.halves as usize];
    let m_rows = comptime![s.m as usize];
    let slot_len = comptime![s.slot_len()];
    for idx in range_stepped(
        UNIT_POS as usize,
        comptime![s.tiles as usize * s.slot_len()],
        CUBE_DIM as usize,
    ) {
        let t = idx / slot_len;
        let o = idx % slot_len;
        let r = o / TILE_N;
        let col = (group * comptime![s.tiles as usize] + t) * TILE_N + o % TILE_N;
        let mut total = 0f32;
        let mut total_up = 0f32;
        #[unroll]
        for w in 0..warps {
            total += red[((t * warps + w) * halves) * slot_len + o];
            if comptime![epilogue.is_gated()] {
                total_up += red[((t * warps + w) * halves + 1) * slot_len + o];
            }
        }
        let mut f = 1f32;
        if comptime![rows_scaled] {
            #[unroll]
            for m in 0..m_rows {
                if r == m {
                    f = row_scale[m];
                }
            }
        }
        if r < m_rows && col < n {
            let mut f_up = f;
            if comptime![cols_scaled] {
                f_up = f;
                if comptime![epilogue.is_gated()] {
                    f_up *= col_scale[up_offset + col];
                }
                f *= col_scale[col];
            }
            if comptime![rows_scaled || cols_scaled] {
                total *= f;
                total_up *= f_up;
            }
            write_epilogue::<F>(out, total, total_up, r, col, n, bias, residual, epilogue);
        }
    }
}
