//! Tensor-core GEMM for f16/bf16 through CubeCL's `cmma` (warp-level 16x16x16 fragments with
//! f32 accumulators; `wmma`/`mma.sync` on NVIDIA).
//!
//! Each cube (`warps_m x warps_n` planes) owns a `BM x BN` tile of y and walks K in steps of
//! `BK` (32 or 64) through `stages` shared-memory buffers; each plane accumulates a
//! `(BM / warps_m) x (BN / warps_n)` block as a grid of 16x16 fragments, so that every A and B
//! fragment it loads feeds several MMAs. Both operands are K-contiguous in shared memory (x as
//! `[BM][BK]` row-major, the rows of w as `[BN][BK]`, which is exactly the column-major B
//! operand), rows padded by 8 elements: a pitch of `BK + 8` elements is an odd multiple of 16
//! bytes, so the 8 rows of an 8x8 fragment load and the 16-byte copies into a row land in
//! different bank groups.
//!
//! Two ways to fill the buffers (the comptime `stages`):
//! - `stages >= 2` ([`crate::gemm::run_async_pipeline()`]), the default on CUDA (sm_80+:
//!   `features.copy_async`) when a row of K is a multiple of 4 bytes: a `cp.async` pipeline. The copies of step `t + stages - 1` are in
//!   flight while step `t` is computed. Each stage has an mbarrier (arrival count: the whole
//!   cube); every unit commits its copies to the stage's barrier (`commit_copy_async`, which
//!   is not an arrival) and later `arrive_and_wait`s on it before reading the stage. Passing
//!   that wait also proves that every plane has finished the previous step, so the stage that
//!   step read can be overwritten by the next copies without a `sync_cube`. Copies outside the
//!   matrix (M, N or K tails) are zero-filled by the copy itself (source size 0). No registers
//!   are spent on staging.
//! - `stages == 0` ([`crate::gemm::run_register_double_buffer()`]; runtimes without async
//!   copies, and odd K where a vector is 2 bytes): the next step is loaded into registers while the tensor cores work on the current buffer,
//!   then stored into the other one (double buffer, one `sync_cube` per step).
//!
//! The tile shape is picked per problem (see [`CmmaTile::auto`]): 128x128 with 4 planes of
//! 64x64 (8 planes of 64x32 for the gated MLP; a 4-stage pipeline when K >= 4096) when that
//! gives about one cube per SM, else 64x64, so that the small prefill projections still fill
//! the GPU (a tile sweep measured on an H100 chose these). [`super::MatmulStrategy::TensorCore`]
//! forces a tile (tests, benchmark sweeps).
//!
//! The gated MLP packs both weights into one B tile (a stacked [`crate::gemm::TileCopy`]): its
//! first `BN / 2` rows are gate rows, the other half the matching up rows, so a tile covers
//! `BN / 2` output columns and each plane owns as many gate fragments as up fragments for the
//! same columns.
//!
//! The epilogue goes through a 16x16 f32 scratch per plane (two when gated): the fragment is
//! stored there, each lane then takes 8 consecutive elements of a row, applies the gated
//! activation (gate and up rounded to the dtype first, as an unfused MLP would), adds bias and
//! residual, rounds once and writes with bounds ([`crate::gemm::write_fragments()`]). Tiles are
//! visited in grouped order (`GROUP_M` tile rows at a time) for L2 reuse of w.
//!
//! The stage drivers, copies and epilogue are the shared ones of [`crate::gemm`]; `kernel.rs`
//! holds what is particular to this kernel (its state for the drivers, the fragment loop of a
//! K step), `blueprint.rs` the sizes derived from the compile key, `tile.rs` the tile choice.

mod blueprint;
mod kernel;
mod tile;

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

use super::Problem;
use crate::{caps, DType, OpsError, Result};
use kernel::cmma_gemm_kernel;

pub use blueprint::CmmaBlueprint;
pub use tile::CmmaTile;

/// Tile rows visited together (grouped order, for L2 reuse of w).
const GROUP_M: u32 = 8;

/// Whether the runtime has 16x16x16 fragments of `dtype` with f32 accumulation.
pub(crate) fn supported<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    let kind = match dtype {
        DType::F16 => FloatKind::F16,
        DType::BF16 => FloatKind::BF16,
        _ => return false,
    };
    if caps::plane_size_min(client) != 32 || client.properties().hardware.plane_size_max != 32 {
        return false;
    }
    let want = ElemType::Float(kind);
    let acc = ElemType::Float(FloatKind::F32);
    client.features().matmul.cmma.iter().any(|c: &MmaConfig| {
        c.a_type == want
            && c.b_type == want
            && c.cd_type == acc
            && c.m == 16
            && c.n == 16
            && c.k == 16
    })
}

/// Launches the tensor-core GEMM with `tile` on a validated problem; `InvalidArgument` when the
/// tile cannot run it (see [`CmmaTile::is_valid`]) or needs more shared memory than the device
/// has.
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    tile: CmmaTile,
) -> Result<()> {
    let gated = p.gated.is_some();
    let dtype = p.x.dtype();
    let smem = client.properties().hardware.max_shared_memory_size;
    if !tile.is_valid(gated) || tile.shared_bytes(dtype.size(), gated) > smem {
        return Err(OpsError::invalid(
            op,
            format!(
                "tensor-core tile {tile:?} is not valid here (gated: {gated}; {} bytes of shared \
                 memory, {smem} available)",
                tile.shared_bytes(dtype.size(), gated)
            ),
        ));
    }
    let vector = caps::vector_size_for(client, dtype, p.k).min(tile.bk as usize);
    // cp.async moves 4, 8 or 16 bytes: 2-byte vectors (odd K) take the register path.
    let stages = if client.features().copy_async && vector * dtype.size() >= 4 {
        tile.stages
    } else {
        0
    };
    let bp = CmmaBlueprint {
        bm: tile.bm,
        bn: tile.bn,
        bk: tile.bk,
        warps_m: tile.warps_m,
        warps_n: tile.warps_n,
        stages,
        vector: vector as u32,
        group_m: GROUP_M,
        epilogue: p.epilogue(),
    };
    let tiles_m = p.m.div_ceil(tile.bm as usize);
    let tiles_n = p.n.div_ceil(tile.out_cols(gated));
    launch_dense!(cmma_gemm_kernel::<R>(
        client,
        crate::launch::cube_count_1d(client, (tiles_m * tiles_n) as u32),
        CubeDim::new_1d(tile.units()),
        p,
        [vector],
        [
            p.m,
            p.n,
            p.k,
            p.up_row_offset,
            tiles_m,
            tiles_n,
            bp,
            dtype.elem_type()
        ]
    ));
    Ok(())
}
