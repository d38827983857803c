//! `#[cube]` building blocks shared by the GEMM-like kernels (the dense GEMV, tiled and
//! tensor-core GEMMs of [`crate::matmul`], and the quantized and block-sparse kernels of the
//! `quant` and `sparse` crates), so that each is written once:
//!
//! - [`epilogue`]: the comptime [`EpilogueBlueprint`] (bias, residual, gated activation) and the
//!   per-element writer `acc (+ gated up) -> act -> + bias -> + residual -> round once`
//!   ([`epilogue_value()`], [`write_epilogue()`]); the dequantizing form `acc · sa · sb` of the
//!   8-bit GEMMs ([`DequantBlueprint`], [`dequant_epilogue()`], [`dequant_epilogue_scaled()`]); the
//!   tensor-core fragment -> shared scratch -> global writer ([`write_fragments()`]).
//! - [`pipeline`]: the `cp.async` stage ring with one mbarrier per stage
//!   ([`run_async_pipeline()`] over a kernel's [`AsyncStages`]) and the register-staged double
//!   buffer ([`run_register_double_buffer()`] over a kernel's [`RegisterStages`]).
//! - [`loader`]: the zero-filling `cp.async` copy ([`copy_or_zero_async()`]), cube-wide copies of
//!   a tile step described by a [`TileCopy`] (rows of one matrix, or stacked from two: see
//!   [`tile_row()`]; asynchronous: [`issue_tile_async()`]; through registers: [`load_tile_regs()`] /
//!   [`store_tile_regs()`]), and the transposed scalar
//!   tile load of the portable tiled GEMM ([`load_tile_transposed()`]).
//! - [`split_k`]: K split across cubes with a deterministic reduction in the last cube to finish
//!   ([`last_to_finish()`], [`SplitScratch`]), for the decode products whose column groups are
//!   too few to fill the GPU.
//! - [`grouped_tile()`]: the grouped visiting order of output tiles (L2 reuse of the weights), and
//!   [`cube_tile_origin()`]: where the cube's output tile starts in that order.
//!
//! Everything here is a `#[cube]` function or a comptime value: it expands inline into the
//! calling kernel, so sharing it costs nothing at run time.

pub mod epilogue;
pub mod loader;
pub mod pipeline;
pub mod split_k;

use cubecl::prelude::*;

pub use epilogue::{
    activation, ahead_sums, bias_value, dequant_epilogue, dequant_epilogue_scaled, epilogue_loaded,
    epilogue_value, residual_value, residuals_ahead, scale_at, write_epilogue,
    write_epilogue_ahead, write_fragments, Activation, DequantBlueprint, EpilogueBlueprint,
    FragmentGrid, AHEAD_ROWS, FRAG,
};
pub use loader::{
    copy_or_zero_async, issue_tile_async, load_tile_regs, load_tile_transposed, store_tile_regs,
    tile_row, TileCopy,
};
pub use pipeline::{run_async_pipeline, run_register_double_buffer, AsyncStages, RegisterStages};
pub use split_k::{fence_device, last_to_finish, SplitNeed, SplitScratch};

/// The (tile-row, tile-column) that cube `pid` computes when a `tiles_m x tiles_n` grid of
/// output tiles is visited in groups of `group_m` tile-rows: cubes running at the same time
/// then share their weight (column) tiles in L2.
#[cube]
pub fn grouped_tile(
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

/// The origin `(m0, n0)` of the `bm x bn` tile of an `[m, n]` output that this cube computes, in
/// the order of [`grouped_tile()`] (`group_m = 1`: row-major). For a launch of one cube per tile
/// along x ([`crate::launch::cube_count_1d`]); a cube past the last tile (a count folded into y
/// has a few spare ones) terminates.
#[cube]
pub fn cube_tile_origin(
    m: usize,
    n: usize,
    #[comptime] bm: u32,
    #[comptime] bn: u32,
    #[comptime] group_m: u32,
) -> (usize, usize) {
    let tiles_m = m.div_ceil(bm as usize);
    let tiles_n = n.div_ceil(bn as usize);
    if CUBE_POS >= tiles_m * tiles_n {
        terminate!();
    }
    let (tile_m, tile_n) = grouped_tile(CUBE_POS, tiles_m, tiles_n, group_m);
    (tile_m * bm as usize, tile_n * bn as usize)
}
