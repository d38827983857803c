//! The second pass for block-rows the work list cut along K: sums their f32 partials (and the
//! bias) into `y`.

use cubecl::prelude::*;

/// Adds the partial sums of the cut block-rows (and the bias) into `y`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn bsr_split_reduce_kernel<F: Float>(
    partial: &[f32],
    splits: &[i32],
    bias: &[F],
    y: &mut [F],
    m: usize,
    n: usize,
    #[comptime] block: usize,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: ElemType,
) {
    let s = CUBE_POS_X as usize;
    let brow = splits[s * 3] as usize;
    let first = splits[s * 3 + 1] as usize;
    let count = splits[s * 3 + 2] as usize;
    let e = CUBE_POS_Y as usize * CUBE_DIM as usize + UNIT_POS as usize;
    if e < m * block {
        let r = e / block;
        let c = e % block;
        let mut v = 0f32;
        for q in 0..count {
            v += partial[((first + q) * m + r) * block + c];
        }
        if comptime![has_bias] {
            v += f32::cast_from(bias[brow * block + c]);
        }
        y[r * n + brow * block + c] = F::cast_from(v);
    }
}
