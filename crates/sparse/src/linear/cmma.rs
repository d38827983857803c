//! The tensor-core variant of the BSR matmul (CubeCL `cmma`, 16x16x16 fragments, f32
//! accumulators), used for f16/bf16 where the runtime reports that shape (CUDA).
//!
//! Warps are laid out as `k_groups` groups of `warps_per_group`: within a group each warp owns a
//! strip of 16 (or 32) rows of the tile across all `b` columns; different groups multiply
//! different blocks of the same stage (`group_blocks` each). Fragments of `x` are row-major `[16 rows, 16 k]` reads of
//! the staged tile; the weight block `W[n, k]` read column-major is exactly the `B = Wᵀ` operand.

use cubecl::cmma;
use cubecl::prelude::barrier::{copy_async_checked, Barrier};
use cubecl::prelude::*;

use super::blueprint::FRAG;
use super::staging::{
    load_cols, load_stage, stage_slot, store_stage, work_item, write_tile, BsrArgs,
};
use super::Blueprint;

/// Multiplies this warp's blocks of the stage in shared buffer `buf` into its accumulators: group
/// `g` takes blocks `g * group_blocks ..` of the stage (those past `end` are skipped, uniformly
/// per warp).
#[cube]
#[allow(clippy::too_many_arguments)]
fn mma_stage<F: Float, N: Size>(
    x_sh: &[Vector<F, N>],
    w_sh: &[Vector<F, N>],
    accs: &mut Sequence<cmma::Matrix<f32>>,
    a_frags: &mut Sequence<cmma::Matrix<F>>,
    b_frag: &mut cmma::Matrix<F>,
    buf: usize,
    stage_first: usize,
    end: usize,
    group: usize,
    row0: usize,
    #[comptime] bp: Blueprint,
) {
    let frag_rows = comptime![bp.frag_rows()];
    let frag_cols = comptime![bp.frag_cols()];
    let xsv = comptime![bp.xsv()];
    let wsv = comptime![bp.wsv()];
    let x_stride = comptime![bp.x_stride() as u32];
    let w_stride = comptime![bp.w_stride() as u32];
    let kstep_v = comptime![FRAG / bp.vector];
    let x_len = comptime![bp.buffers() * bp.x_stage()];
    let w_len = comptime![bp.buffers() * bp.w_stage()];
    #[unroll]
    for t in 0..bp.group_blocks {
        let j = group * comptime![bp.group_blocks] + t;
        if stage_first + j < end {
            let x_base = buf * comptime![bp.x_stage()] + (j * comptime![bp.tile_m] + row0) * xsv;
            let w_base = buf * comptime![bp.w_stage()] + j * comptime![bp.block] * wsv;
            #[unroll]
            for kk in 0..comptime![bp.block / FRAG] {
                #[unroll]
                for fr in 0..frag_rows {
                    let off = x_base + fr * comptime![FRAG * bp.xsv()] + kk * kstep_v;
                    cmma::load(a_frags.index_mut(fr), &x_sh[off..x_len], x_stride);
                }
                #[unroll]
                for fc in 0..frag_cols {
                    let off = w_base + fc * comptime![FRAG * bp.wsv()] + kk * kstep_v;
                    cmma::load(b_frag, &w_sh[off..w_len], w_stride);
                    #[unroll]
                    for fr in 0..frag_rows {
                        let acc = accs.index(fr * frag_cols + fc);
                        cmma::execute(a_frags.index(fr), &*b_frag, acc, acc);
                    }
                }
            }
        }
    }
}

/// Starts the `cp.async` copies of the stage's blocks `[first, first + stage_blocks)` (clipped
/// to `end`) into shared buffer `buf`, slot by slot as [`stage_slot`] maps them (the layout of
/// [`store_stage`]), with the block columns `cols` read one stage earlier; out-of-range slots are
/// zero-filled by the copy (source size 0). Then reads the columns of the following stage into
/// `cols`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn issue_stage<F: Float, N: Size>(
    io: &BsrArgs<Vector<F, N>, F>,
    cols: &mut Array<u32>,
    x_sh: &mut [Vector<F, N>],
    w_sh: &mut [Vector<F, N>],
    buf: usize,
    first: usize,
    end: usize,
    m0: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let vector = comptime![bp.vector as u32];
    let total = comptime![bp.total_loads()];
    #[unroll]
    for i in 0..bp.loads_per_unit() {
        let idx = i * comptime![bp.units] + unit;
        let (is_x, ok, src, dst) =
            stage_slot(idx, cols[i], buf, first, end, m0, io.m, io.k_vectors, bp);
        let src = select(ok, src, 0usize);
        let len = select(ok, 1usize, 0usize);
        if is_x {
            copy_async_checked(&io.x[src..src + len], &mut x_sh[dst..dst + 1], vector);
        } else if idx < total {
            copy_async_checked(&io.values[src..src + len], &mut w_sh[dst..dst + 1], vector);
        }
    }
    load_cols(&io.col, cols, first + comptime![bp.stage_blocks()], end, bp);
}

#[cube(launch_unchecked)]
pub(super) fn bsr_linear_cmma_kernel<F: Float, N: Size>(
    mut io: BsrArgs<Vector<F, N>, F>,
    #[comptime] bp: Blueprint,
    #[define(F)] _dtype: ElemType,
) {
    let m0 = CUBE_POS_Y as usize * comptime![bp.tile_m];
    let (brow, start, end, slot) = work_item(&io.items);

    let x_len = comptime![bp.buffers() * bp.x_stage()];
    let w_len = comptime![bp.buffers() * bp.w_stage()];
    let out_len = comptime![bp.out_len()];
    let mut x_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(x_len, 128usize);
    let mut w_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(w_len, 128usize);
    let mut out_sh = Shared::<[f32]>::new_aligned_slice(out_len, 128usize);
    let mut cols = Array::<u32>::new(comptime![bp.loads_per_unit()]);

    let frag_rows = comptime![bp.frag_rows()];
    let frag_cols = comptime![bp.frag_cols()];
    let warp = UNIT_POS as usize / comptime![bp.plane];
    let group = warp / comptime![bp.warps_per_group()];
    let row0 = (warp % comptime![bp.warps_per_group()]) * comptime![bp.frag_rows() * FRAG];

    let mut accs = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..comptime![bp.frag_rows() * bp.frag_cols()] {
        accs.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            FRAG,
            FRAG,
            FRAG,
            cmma::MatrixLayout::Undefined,
            0f32,
        ));
    }
    let mut a_frags = Sequence::<cmma::Matrix<F>>::new();
    #[unroll]
    for _ in 0..comptime![bp.frag_rows()] {
        a_frags.push(unsafe {
            cmma::Matrix::<F>::uninitialized(
                cmma::MatrixIdent::A,
                FRAG,
                FRAG,
                FRAG,
                cmma::MatrixLayout::RowMajor,
            )
        });
    }
    let mut b_frag = unsafe {
        cmma::Matrix::<F>::uninitialized(
            cmma::MatrixIdent::B,
            FRAG,
            FRAG,
            FRAG,
            cmma::MatrixLayout::ColMajor,
        )
    };

    let sb = comptime![bp.stage_blocks()];
    let count = end - start;
    let stages = count.div_ceil(sb);
    if comptime![bp.stages >= 2] {
        // cp.async pipeline: stage t + depth - 1 is copied while stage t is multiplied (the
        // same scheme as the dense GEMM, `ops::matmul`). Every unit commits its copies to the
        // buffer's mbarrier (not an arrival) and arrives-and-waits before reading the buffer;
        // passing that wait also proves every warp finished the stage before, so its buffer
        // can be refilled without a `sync_cube`.
        let depth = comptime![bp.stages];
        let mut bars = Sequence::<Shared<Barrier>>::new();
        #[unroll]
        for _ in 0..depth {
            bars.push(Barrier::shared(CUBE_DIM, UNIT_POS == 0));
        }
        load_cols(&io.col, &mut cols, start, end, bp);
        #[unroll]
        for s in 0..depth - 1 {
            if s < stages {
                let first = start + s * sb;
                issue_stage(&io, &mut cols, &mut x_sh, &mut w_sh, s, first, end, m0, bp);
            }
            bars.index(s).commit_copy_async();
        }
        for t0 in range_stepped(0, stages, depth) {
            #[unroll]
            for s in 0..depth {
                let t = t0 + s;
                if t < stages {
                    bars.index(s).arrive_and_wait();
                    let next = comptime![(s + depth - 1) % depth];
                    let nt = t + depth - 1;
                    if nt < stages {
                        let first = start + nt * sb;
                        issue_stage(
                            &io, &mut cols, &mut x_sh, &mut w_sh, next, first, end, m0, bp,
                        );
                    }
                    bars.index(next).commit_copy_async();
                    mma_stage(
                        &x_sh,
                        &w_sh,
                        &mut accs,
                        &mut a_frags,
                        &mut b_frag,
                        s,
                        start + t * sb,
                        end,
                        group,
                        row0,
                        bp,
                    );
                }
            }
        }
    } else if stages > 0 {
        // Register staging: the next stage waits in registers while this one is multiplied, and
        // is stored into the other shared buffer afterwards (one barrier per stage); with one
        // buffer (small shared memories) it is stored once every warp is done with the current
        // one (two). The columns of stage 0, its data, then the columns of stage 1: from here on
        // the column indices of a stage are read one stage before its data.
        let mut regs = Array::<Vector<F, N>>::new(comptime![bp.loads_per_unit()]);
        load_cols(&io.col, &mut cols, start, end, bp);
        load_stage(&io, &cols, &mut regs, start, end, m0, bp);
        load_cols(&io.col, &mut cols, start + sb, end, bp);
        if comptime![bp.double_buffer] {
            store_stage(&regs, &mut x_sh, &mut w_sh, 0, bp);
            sync_cube();
        }
        for s in 0..stages {
            let first = start + s * sb;
            let mut buf = 0usize;
            if comptime![bp.double_buffer] {
                buf = s % 2;
            }
            if comptime![!bp.double_buffer] {
                if s > 0 {
                    sync_cube();
                }
                store_stage(&regs, &mut x_sh, &mut w_sh, 0, bp);
                sync_cube();
            }
            if s + 1 < stages {
                load_stage(&io, &cols, &mut regs, first + sb, end, m0, bp);
                load_cols(&io.col, &mut cols, first + 2 * sb, end, bp);
            }
            mma_stage(
                &x_sh,
                &w_sh,
                &mut accs,
                &mut a_frags,
                &mut b_frag,
                buf,
                first,
                end,
                group,
                row0,
                bp,
            );
            if comptime![bp.double_buffer] {
                if s + 1 < stages {
                    store_stage(&regs, &mut x_sh, &mut w_sh, (s + 1) % 2, bp);
                }
                sync_cube();
            }
        }
        if comptime![!bp.double_buffer] {
            sync_cube();
        }
    }

    let os = comptime![bp.out_stride()];
    #[unroll]
    for fr in 0..frag_rows {
        #[unroll]
        for fc in 0..frag_cols {
            let off = (group * comptime![bp.tile_m] + row0 + fr * FRAG) * os + fc * FRAG;
            cmma::store(
                &mut out_sh[off..out_len],
                accs.index(fr * frag_cols + fc),
                os as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
    }
    sync_cube();
    write_tile(&out_sh, &mut io, brow, slot, m0, bp);
}
