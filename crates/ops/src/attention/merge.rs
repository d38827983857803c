//! Combining the partials of a split launch: one cube per output row.

use cubecl::prelude::*;

use super::plan::Problem;
use super::workspace::Partials;
use crate::launch::cube_count_1d;
use crate::online_softmax::{exp_or_zero, EMPTY_MAX};
use crate::reduce::{cube_max, ReducePlan};

/// The comptime shape of [`merge_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MergeBlueprint {
    pub d: usize,
    /// Units along the head dimension.
    pub lanes: usize,
    /// Groups of splits merged in parallel (the cube has `lanes * groups` units).
    pub groups: usize,
    /// Splits per group (unrolled, so that their loads are in flight together).
    pub per_group: usize,
    pub plan: ReducePlan,
    /// Signal `griddepcontrol.launch_dependents` first: set for a launch whose cubes all fit on
    /// the GPU at once (decode), so that the kernel after it (the output projection) is launched
    /// at once and streams its weights while the merge runs.
    pub trigger: bool,
}

impl MergeBlueprint {
    /// About one group per 4 splits, up to 32 groups (a 1024-unit cube).
    pub fn new<R: Runtime>(client: &ComputeClient<R>, d: usize, splits: usize) -> Self {
        let hw = &client.properties().hardware;
        let groups = (splits / 4)
            .min(hw.max_units_per_cube as usize / 32)
            .min(hw.max_shared_memory_size / (4 * (d + 2)))
            .clamp(1, 32);
        Self::with_groups(client, d, splits, 1 << groups.ilog2())
    }

    /// The merge done by a cube of `units` units of another kernel (a multiple of 32): one
    /// group per 32 units.
    pub fn for_cube<R: Runtime>(
        client: &ComputeClient<R>,
        d: usize,
        splits: usize,
        units: usize,
    ) -> Self {
        Self::with_groups(client, d, splits, (units / 32).max(1))
    }

    fn with_groups<R: Runtime>(
        client: &ComputeClient<R>,
        d: usize,
        splits: usize,
        groups: usize,
    ) -> Self {
        Self {
            d,
            lanes: 32,
            groups,
            per_group: splits.div_ceil(groups),
            plan: ReducePlan::new(client, (32 * groups) as u32),
            trigger: false,
        }
    }

    pub fn units(&self) -> u32 {
        (self.lanes * self.groups) as u32
    }
}

/// Combines the per-split partials of one output row (one cube per row): `out = Σ_s w_s acc_s /
/// Σ_s w_s sum_s` with `w_s = exp(max_s - max)`. Splits that saw no key (max = EMPTY_MAX) weigh
/// 0. Unit (group, lane) takes the splits `group + i · groups` and issues the loads of all their
/// statistics and accumulator elements in one batch, so that the kernel is one memory latency
/// long, not one per dependent step: the cube's maximum is the only reduction before the
/// weighted sums, which the groups then add in shared memory in a fixed order.
#[cube(launch_unchecked)]
pub(crate) fn merge_kernel<F: Float>(
    part_acc: &[f32],
    part_stats: &[f32],
    out: &mut [F],
    splits: u32,
    rows_out: u32,
    #[comptime] blueprint: MergeBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    if comptime![blueprint.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }
    let rows = rows_out as usize;
    merge_row::<F>(
        part_acc,
        part_stats,
        out,
        min(CUBE_POS, rows - 1),
        CUBE_POS < rows,
        splits,
        rows_out,
        blueprint,
    );
}

/// The body of [`merge_kernel`] for output row `row` in the cube that runs it (its first
/// `blueprint.units()` units; the output is written only with `write`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn merge_row<F: Float>(
    part_acc: &[f32],
    part_stats: &[f32],
    out: &mut [F],
    row: usize,
    write: bool,
    splits: u32,
    rows_out: u32,
    #[comptime] blueprint: MergeBlueprint,
) {
    let d = comptime![blueprint.d];
    let lanes = comptime![blueprint.lanes];
    let groups = comptime![blueprint.groups];
    let per_group = comptime![blueprint.per_group];
    let dpl = comptime![blueprint.d.div_ceil(blueprint.lanes)];
    let rows = rows_out as usize;
    let lane = UNIT_POS as usize % lanes;
    let grp = UNIT_POS as usize / lanes;
    let empty = f32::new(EMPTY_MAX);

    // Every load of the unit's splits at once; a split past the count reads as empty.
    let mut ms = Array::<f32>::new(per_group);
    let mut ls = Array::<f32>::new(per_group);
    let mut accs = Array::<f32>::new(comptime![per_group * dpl]);
    #[unroll]
    for i in 0..per_group {
        let s = grp + i * groups;
        let prow = min(s, splits as usize - 1) * rows + row;
        let live = s < splits as usize;
        ms[i] = select(live, part_stats[prow * 2], empty);
        ls[i] = part_stats[prow * 2 + 1];
        #[unroll]
        for t in 0..dpl {
            let dd = lane + t * lanes;
            let mut a = 0f32;
            if comptime![(t + 1) * lanes <= d] || dd < d {
                a = part_acc[prow * d + dd];
            }
            accs[i * dpl + t] = a;
        }
    }
    let mut m_local = empty;
    #[unroll]
    for i in 0..per_group {
        m_local = max(m_local, ms[i]);
    }
    let m = cube_max(m_local, blueprint.plan);

    let mut l = 0f32;
    let mut acc = Array::<f32>::new(dpl);
    #[unroll]
    for t in 0..dpl {
        acc[t] = 0f32;
    }
    #[unroll]
    for i in 0..per_group {
        let w = exp_or_zero(ms[i], m);
        l += ls[i] * w;
        #[unroll]
        for t in 0..dpl {
            acc[t] += accs[i * dpl + t] * w;
        }
    }

    let mut acc_sh = Shared::<[f32]>::new_slice(comptime![groups * d]);
    let mut l_sh = Shared::<[f32]>::new_slice(groups);
    #[unroll]
    for t in 0..dpl {
        let dd = lane + t * lanes;
        if comptime![(t + 1) * lanes <= d] || dd < d {
            acc_sh[grp * d + dd] = acc[t];
        }
    }
    if lane == 0 {
        l_sh[grp] = l;
    }
    sync_cube();

    if grp == 0 && write {
        let mut total_l = 0f32;
        #[unroll]
        for g in 0..groups {
            total_l += l_sh[g];
        }
        let inv = select(total_l > 0f32, 1f32 / total_l, 0f32);
        #[unroll]
        for t in 0..dpl {
            let dd = lane + t * lanes;
            if comptime![(t + 1) * lanes <= d] || dd < d {
                let mut a = 0f32;
                #[unroll]
                for g in 0..groups {
                    a += acc_sh[g * d + dd];
                }
                out[row * d + dd] = F::cast_from(a * inv);
            }
        }
    }
}

/// Launches [`merge_kernel`] over the `splits` partials of `p`, writing `p.out`.
pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    parts: &Partials<'_, R>,
    splits: usize,
) {
    let rows_out = p.rows_out();
    let mut blueprint = MergeBlueprint::new(client, p.d, splits);
    blueprint.trigger = crate::caps::has_launch_dependents(client)
        && rows_out <= crate::caps::num_sms(client) as usize;
    unsafe {
        merge_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, rows_out as u32),
            CubeDim::new_1d(blueprint.units()),
            parts.acc().as_buffer_arg(),
            parts.stats().as_buffer_arg(),
            p.out.as_buffer_arg(),
            splits as u32,
            rows_out as u32,
            blueprint,
            p.q.dtype().elem_type(),
        );
    }
}
