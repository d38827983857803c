//! The end of [`super::float_x_simt_kernel`]: the epilogue's operands loaded ahead of their use
//! (the weight rows' scales) and the column groups' sums, reduced in one pass where x has at most
//! [`ops::gemm::AHEAD_ROWS`] rows.

use cubecl::prelude::*;
use ops::gemm::ahead_sums;
use ops::reduce::{lane_group_sum, row_sum_split_in, row_sums_shared_len, row_sums_split_in};

use super::{column_row, SimtPlan};

impl SimtPlan {
    /// The sums the epilogue reduces in one pass ([`ahead_sums`]).
    pub(super) fn sums(&self) -> usize {
        ahead_sums(self.m, self.cols, self.epilogue.is_gated(), self.norm)
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
