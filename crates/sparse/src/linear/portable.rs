//! The portable kernel: a vectorised f32 dot product per unit (f32, and every runtime without
//! tensor cores: wgpu/lavapipe has neither tensor cores nor plane ops).

use cubecl::prelude::*;
use ops::reduce::vector_sum;

use super::staging::{load_cols, load_stage, store_stage, work_item, write_output, BsrArgs};
use super::Blueprint;

/// Multiplies one staged block (buffer `buf`) into the unit's accumulators: unit `u` owns output
/// column `u % b` of rows `u / b + i * rows_per_pass`, and reads whole vectors of the block row.
#[cube]
fn dot_stage<F: Float, N: Size>(
    x_sh: &[Vector<F, N>],
    w_sh: &[Vector<F, N>],
    acc: &mut Array<f32>,
    buf: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let c = unit % comptime![bp.block];
    let r0 = unit / comptime![bp.block];
    let xsv = comptime![bp.xsv()];
    let x_base = buf * comptime![bp.x_stage()];
    let w_row = buf * comptime![bp.w_stage()] + c * comptime![bp.wsv()];
    #[unroll]
    for jv in 0..bp.bv() {
        let wv = Vector::<f32, N>::cast_from(w_sh[w_row + jv]);
        #[unroll]
        for i in 0..bp.outputs_per_unit() {
            let r = r0 + i * comptime![bp.rows_per_pass()];
            let xv = Vector::<f32, N>::cast_from(x_sh[x_base + r * xsv + jv]);
            acc[i] += vector_sum(xv * wv);
        }
    }
}

/// The vectorised-dot-product kernel (f32, and every dtype where tensor cores are absent). A
/// stage is one block. With two shared buffers the next stage waits in registers while this one
/// is multiplied and is stored into the other buffer afterwards (one barrier per stage); with one
/// (small shared memories) it is stored once every unit is done with the current one (two).
#[cube(launch_unchecked)]
pub(super) fn bsr_linear_scalar_kernel<F: Float, N: Size>(
    mut io: BsrArgs<Vector<F, N>, F>,
    #[comptime] bp: Blueprint,
    #[define(F)] _dtype: ElemType,
) {
    let m0 = CUBE_POS_Y as usize * comptime![bp.tile_m];
    let (brow, start, end, slot) = work_item(&io.items);

    let mut x_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
        comptime![bp.buffers() * bp.x_stage()],
        128usize,
    );
    let mut w_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
        comptime![bp.buffers() * bp.w_stage()],
        128usize,
    );
    let mut regs = Array::<Vector<F, N>>::new(comptime![bp.loads_per_unit()]);
    let mut cols = Array::<u32>::new(comptime![bp.loads_per_unit()]);
    let mut acc = Array::<f32>::new(comptime![bp.outputs_per_unit()]);
    #[unroll]
    for i in 0..bp.outputs_per_unit() {
        acc[i] = 0f32;
    }

    let stages = end - start;
    if stages > 0 {
        load_cols(&io.col, &mut cols, start, end, bp);
        load_stage(&io, &cols, &mut regs, start, end, m0, bp);
        if comptime![bp.double_buffer] {
            store_stage(&regs, &mut x_sh, &mut w_sh, 0, bp);
            sync_cube();
        }
        for s in 0..stages {
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
            let next = start + s + 1;
            if s + 1 < stages {
                load_cols(&io.col, &mut cols, next, end, bp);
                load_stage(&io, &cols, &mut regs, next, end, m0, bp);
            }
            dot_stage(&x_sh, &w_sh, &mut acc, buf, bp);
            if comptime![bp.double_buffer] {
                if s + 1 < stages {
                    store_stage(&regs, &mut x_sh, &mut w_sh, (s + 1) % 2, bp);
                }
                sync_cube();
            }
        }
    }

    let unit = UNIT_POS as usize;
    let c = unit % comptime![bp.block];
    let r0 = unit / comptime![bp.block];
    #[unroll]
    for i in 0..bp.outputs_per_unit() {
        let r = r0 + i * comptime![bp.rows_per_pass()];
        if m0 + r < io.m {
            write_output(&mut io, acc[i], brow, slot, m0 + r, c, bp);
        }
    }
}
