//! The end of [`super::float_x_simt_kernel`]: the epilogue's operands loaded ahead of their use
//! (the weight rows' scales, the residual) and the column groups' sums, reduced in one pass where
//! x has at most [`PRELOAD_ROWS`] rows.

use cubecl::prelude::*;
use ops::gemm::residual_value;
use ops::pdl::index_after;
use ops::reduce::{lane_group_sum, row_sum_split_in, row_sums_shared_len, row_sums_split_in};

use super::{column_row, SimtPlan};

impl SimtPlan {
    /// The sums the epilogue reduces in one pass where x has at most [`PRELOAD_ROWS`] rows: the
    /// columns' products, the up products when gated, and x's squares behind the input norm (one
    /// where x has more rows, which reduce one value at a time).
    pub(super) fn sums(&self) -> usize {
        if self.m > PRELOAD_ROWS {
            return 1;
        }
        let products = (self.m * self.cols) as usize;
        let halves = if self.epilogue.is_gated() { 2 } else { 1 };
        products * halves + if self.norm { self.m as usize } else { 0 }
    }

    /// f32s of the epilogue's shared reduction buffer (one value's where they reduce one at a
    /// time).
    pub(super) fn shared_len(&self) -> usize {
        let (lanes, splits, rows) = (self.lanes, self.splits, self.groups_per_cube);
        row_sums_shared_len(self.sums(), lanes, splits, rows, self.use_plane)
    }
}

/// Each column's weight-row scales (the gate's, then the up row's when gated) into `scales`,
/// read once for all rows of x.
#[cube]
pub(super) fn load_scales(
    w_scale: &[f32],
    scales: &mut Array<f32>,
    col0: usize,
    n_cols: usize,
    up_offset: usize,
    #[comptime] plan: SimtPlan,
) {
    let cols = comptime![plan.cols as usize];
    #[unroll]
    for j in 0..cols {
        let row = column_row(col0 + j, n_cols);
        scales[j] = w_scale[row];
        if comptime![plan.epilogue.is_gated()] {
            scales[cols + j] = w_scale[up_offset + row];
        }
    }
}

/// The residual of each row of x and column of the group into `residual_f[m * cols + j]` (a
/// column past N reads column N - 1's, never written), once the unit's partial dot product of
/// that row and column (`acc[m * cols + j]`) is known ([`index_after`]): after the products,
/// before the reductions.
#[cube]
pub(super) fn load_residuals<F: Float>(
    residual: &[F],
    residual_f: &mut Array<f32>,
    col0: usize,
    n_cols: usize,
    acc: &Array<f32>,
    #[comptime] plan: SimtPlan,
) {
    let cols = comptime![plan.cols as usize];
    #[unroll]
    for m in 0..comptime![plan.m as usize] {
        #[unroll]
        for j in 0..cols {
            let col = min(col0 + j, n_cols - 1);
            let at = index_after(m * n_cols + col, acc[m * cols + j], m * n_cols);
            residual_f[m * cols + j] = residual_value::<F>(residual, at, plan.epilogue);
        }
    }
}

/// The most rows of x for which [`float_x_simt_kernel`] loads its epilogue's bias and residual
/// ahead (a bias held through the loop, and a residual a row, per column).
pub(super) const PRELOAD_ROWS: u32 = 2;

/// The sum of `value` over the units of a column group, valid in its unit with x = 0; every unit
/// must call it.
#[cube]
pub(super) fn group_sum(value: f32, red: &mut [f32], #[comptime] plan: SimtPlan) -> f32 {
    if comptime![plan.sub_plane] {
        lane_group_sum(value, plan.lanes)
    } else {
        row_sum_split_in(value, red, plan.lanes, plan.splits, plan.use_plane)
    }
}

/// [`group_sum`] of every value of `sums` at once (`plan.sums()` of them, see
/// [`row_sums_split_in`]); every unit must call it.
#[cube]
pub(super) fn group_sums(sums: &mut Array<f32>, red: &mut [f32], #[comptime] plan: SimtPlan) {
    if comptime![plan.sub_plane] {
        #[unroll]
        for v in 0..comptime![plan.sums()] {
            sums[v] = lane_group_sum(sums[v], plan.lanes);
        }
    } else {
        row_sums_split_in(
            sums,
            red,
            comptime![plan.sums()],
            plan.lanes,
            plan.splits,
            plan.use_plane,
        );
    }
}
