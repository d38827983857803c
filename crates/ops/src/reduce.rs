//! Cube-wide reductions shared by the row kernels (norms, softmax, argmax, GEMV, attention).
//!
//! With plane ops the cube reduces each plane with shuffles and the planes through a small
//! shared array; without them (lavapipe) a shared-memory tree does the same job. The choice is
//! comptime, so each runtime compiles only the path it can run.
//!
//! Where every plane has the same width (CUDA's 32-lane warps), the plane's shuffles and the sum
//! over the planes' partials are unrolled at compile time. CubeCL's `plane_sum` and `plane_max`
//! do not know the width: on CUDA they become a loop over the run-time warp size with a shuffle
//! under `__activemask()` per step, and the planes' partials a loop over `CUBE_DIM / PLANE_DIM`.
//! The unrolled form takes about 100 fewer SASS instructions off a W4A16 decode GEMV whose input
//! RMSNorm sits in front of its tensor-core products, and those reductions are on the decode
//! step's critical path.

use cubecl::prelude::*;

/// The comptime shape of a cube-wide reduction: how many units and whether planes are usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReducePlan {
    /// Units in the cube (a power of two).
    pub cube_dim: u32,
    /// Use `plane_*` instructions (only when the runtime reports them).
    pub use_plane: bool,
    /// The smallest plane size the device may pick (sizes the shared array of partials).
    pub plane_size_min: u32,
    /// Every plane has exactly `plane_size_min` units (the device never picks another width at
    /// run time), so the reductions unroll over it.
    pub plane_size_fixed: bool,
}

impl ReducePlan {
    /// A plan for `cube_dim` units on the runtime behind `client`.
    pub fn new<R: Runtime>(client: &ComputeClient<R>, cube_dim: u32) -> Self {
        debug_assert!(cube_dim.is_power_of_two());
        let plane_size_min = crate::caps::plane_size_min(client);
        Self {
            cube_dim,
            use_plane: crate::caps::has_plane_ops(client) && cube_dim >= plane_size_min,
            plane_size_min,
            plane_size_fixed: crate::caps::has_planes_of(client, plane_size_min),
        }
    }

    /// The number of partials the plane path keeps in shared memory.
    pub fn max_planes(&self) -> u32 {
        (self.cube_dim / self.plane_size_min).max(1)
    }

    /// log2 of the cube size: the number of steps of the shared-memory tree.
    pub fn tree_steps(&self) -> u32 {
        self.cube_dim.trailing_zeros()
    }
}

/// The sum of `value` over the `lanes` units along x of each of the `rows` rows of a
/// `(lanes, rows)` cube (a GEMV's one-column-per-plane layout), valid in the unit with x = 0.
/// With `use_plane` the rows must be planes (`lanes` = the plane size); otherwise a shared-memory
/// pass, which every runtime has. Every unit must call it (it may synchronise the cube).
#[cube]
pub fn row_sum(
    value: f32,
    #[comptime] lanes: u32,
    #[comptime] rows: u32,
    #[comptime] use_plane: bool,
) -> f32 {
    let mut shared =
        Shared::<[f32]>::new_slice(comptime![row_sum_shared_len(lanes, 1, rows, use_plane)]);
    row_sum_split_in(value, &mut shared, lanes, 1u32, use_plane)
}

/// [`row_sum()`] where each row spans `splits` groups of `lanes` units (a GEMV's K split over
/// several planes per column): the units along x of a `(lanes * splits, rows)` cube. With
/// `use_plane` each group must be one plane. Valid in the unit with x = 0; every unit must call it.
#[cube]
pub fn row_sum_split(
    value: f32,
    #[comptime] lanes: u32,
    #[comptime] splits: u32,
    #[comptime] rows: u32,
    #[comptime] use_plane: bool,
) -> f32 {
    let mut shared = Shared::<[f32]>::new_slice(comptime![row_sum_shared_len(
        lanes, splits, rows, use_plane
    )]);
    row_sum_split_in(value, &mut shared, lanes, splits, use_plane)
}

/// The sum of `value` over each aligned group of `lanes` consecutive units of a plane (`lanes` a
/// power of two up to the plane size), returned to every unit of the group: a butterfly of
/// plane shuffles, so that several GEMV columns can share one plane. Plane ops must be there.
#[cube]
pub fn lane_group_sum(value: f32, #[comptime] lanes: u32) -> f32 {
    let mut v = value;
    #[unroll]
    for step in 0..comptime![lanes.trailing_zeros()] {
        v += plane_shuffle_xor(v, comptime![lanes >> (step + 1)]);
    }
    v
}

/// [`lane_group_sum()`] for the maximum.
#[cube]
pub fn lane_group_max(value: f32, #[comptime] lanes: u32) -> f32 {
    let mut v = value;
    #[unroll]
    for step in 0..comptime![lanes.trailing_zeros()] {
        v = max(v, plane_shuffle_xor(v, comptime![lanes >> (step + 1)]));
    }
    v
}

/// The shared `f32` elements [`row_sum_split_in()`] needs (at least 1).
pub fn row_sum_shared_len(lanes: u32, splits: u32, rows: u32, use_plane: bool) -> usize {
    let n = match (use_plane, splits) {
        (true, 1) => 1,
        (true, _) => splits * rows,
        (false, _) => lanes * splits * rows,
    };
    n.max(1) as usize
}

/// [`row_sum_split()`] through a caller's shared buffer of [`row_sum_shared_len`] elements, which
/// successive calls may share: a kernel that reduces many values (a GEMV's rows of x) then holds
/// one buffer, not one per call (on runtimes without plane operations, one per call ran a
/// 16-row gated GEMV out of its 32 KiB of shared memory).
#[cube]
pub fn row_sum_split_in(
    value: f32,
    shared: &mut [f32],
    #[comptime] lanes: u32,
    #[comptime] splits: u32,
    #[comptime] use_plane: bool,
) -> f32 {
    let mut out = 0f32;
    if comptime![use_plane && splits == 1] {
        out = lane_group_sum(value, lanes);
    } else if comptime![use_plane] {
        let partial = lane_group_sum(value, lanes);
        let base = (UNIT_POS_Y * splits) as usize;
        // The previous call's readers are done with the buffer.
        sync_cube();
        if UNIT_POS_PLANE == 0 {
            shared[base + (UNIT_POS_X / lanes) as usize] = partial;
        }
        sync_cube();
        if UNIT_POS_X == 0 {
            #[unroll]
            for i in 0..splits {
                out += shared[base + i as usize];
            }
        }
    } else {
        // A tree: unit 0 summing `lanes * splits` values in an unrolled loop makes a shader that
        // lavapipe takes minutes to compile once a kernel has 16 rows of x.
        let units = comptime![lanes * splits];
        let base = (UNIT_POS_Y * units) as usize;
        let x = UNIT_POS_X as usize;
        sync_cube();
        shared[base + x] = value;
        sync_cube();
        #[unroll]
        for step in 0..comptime![units.trailing_zeros()] {
            let stride = comptime![(units >> (step + 1)) as usize];
            if x < stride {
                let other = shared[base + x + stride];
                shared[base + x] += other;
            }
            sync_cube();
        }
        out = shared[base];
    }
    out
}

/// The shared `f32` elements [`row_sums_split_in()`] needs for `count` values (at least 1).
pub fn row_sums_shared_len(
    count: usize,
    lanes: u32,
    splits: u32,
    rows: u32,
    use_plane: bool,
) -> usize {
    let one = row_sum_shared_len(lanes, splits, rows, use_plane);
    if use_plane && splits > 1 {
        count.max(1) * one
    } else {
        one
    }
}

/// [`row_sum_split_in()`] of `values[0..count]` at once: each is summed over the same units, in
/// the same order, and its sum replaces it in the unit with x = 0 (the other units keep values
/// that mean nothing). With planes split along x, one round of barriers and one shared-memory
/// pass serves every value, where a call per value takes two barriers and a shared-memory round
/// trip each: at the end of a decode GEMV, on the step's critical path, the SIMT 8-bit qkv
/// (two columns and the input norm's squares) took six barriers in a row. `shared` holds
/// [`row_sums_shared_len`] elements. Every unit must call it.
#[cube]
pub fn row_sums_split_in(
    values: &mut Array<f32>,
    shared: &mut [f32],
    #[comptime] count: usize,
    #[comptime] lanes: u32,
    #[comptime] splits: u32,
    #[comptime] use_plane: bool,
) {
    if comptime![use_plane && splits > 1] {
        #[unroll]
        for v in 0..count {
            values[v] = lane_group_sum(values[v], lanes);
        }
        let base = (UNIT_POS_Y * splits) as usize * count;
        // The previous call's readers are done with the buffer.
        sync_cube();
        if UNIT_POS_PLANE == 0 {
            let at = base + (UNIT_POS_X / lanes) as usize * count;
            #[unroll]
            for v in 0..count {
                shared[at + v] = values[v];
            }
        }
        sync_cube();
        if UNIT_POS_X == 0 {
            #[unroll]
            for v in 0..count {
                let mut out = 0f32;
                #[unroll]
                for i in 0..splits {
                    out += shared[base + i as usize * count + v];
                }
                values[v] = out;
            }
        }
    } else {
        #[unroll]
        for v in 0..count {
            values[v] = row_sum_split_in(values[v], shared, lanes, splits, use_plane);
        }
    }
}

/// Stores each plane's `partial` (valid in its first unit) at the plane's index of `shared`,
/// where every unit can read it once this returns.
#[cube]
fn store_plane_partial(partial: f32, shared: &mut [f32]) {
    if UNIT_POS_PLANE == 0 {
        shared[PLANE_POS as usize] = partial;
    }
    sync_cube();
}

/// The sum of `value` over all units of the cube, returned to every unit.
#[cube]
pub fn cube_sum(value: f32, #[comptime] plan: ReducePlan) -> f32 {
    let mut out = 0f32;
    if comptime![plan.use_plane] {
        let partial = if comptime![plan.plane_size_fixed] {
            lane_group_sum(value, plan.plane_size_min)
        } else {
            plane_sum(value)
        };
        let mut shared = Shared::<[f32]>::new_slice(comptime![plan.max_planes() as usize]);
        store_plane_partial(partial, &mut shared);
        if comptime![plan.plane_size_fixed] {
            #[unroll]
            for i in 0..comptime![plan.max_planes()] {
                out += shared[i as usize];
            }
        } else {
            for i in 0..CUBE_DIM / PLANE_DIM {
                out += shared[i as usize];
            }
        }
    } else {
        let mut shared = Shared::<[f32]>::new_slice(comptime![plan.cube_dim as usize]);
        shared[UNIT_POS as usize] = value;
        sync_cube();
        #[unroll]
        for step in 0..plan.tree_steps() {
            let stride = comptime![(plan.cube_dim >> (step + 1)) as usize];
            if (UNIT_POS as usize) < stride {
                let other = shared[UNIT_POS as usize + stride];
                shared[UNIT_POS as usize] += other;
            }
            sync_cube();
        }
        out = shared[0];
    }
    out
}

/// The maximum of `value` over all units of the cube, returned to every unit.
///
/// The identity is `f32::MIN`, not `-inf`: WGSL has no infinity literal (a shader that spells
/// one fails to compile), so kernels use the lowest finite value as "nothing seen yet".
#[cube]
pub fn cube_max(value: f32, #[comptime] plan: ReducePlan) -> f32 {
    let mut out = f32::new(f32::MIN);
    if comptime![plan.use_plane] {
        let partial = if comptime![plan.plane_size_fixed] {
            lane_group_max(value, plan.plane_size_min)
        } else {
            plane_max(value)
        };
        let mut shared = Shared::<[f32]>::new_slice(comptime![plan.max_planes() as usize]);
        store_plane_partial(partial, &mut shared);
        if comptime![plan.plane_size_fixed] {
            #[unroll]
            for i in 0..comptime![plan.max_planes()] {
                out = max(out, shared[i as usize]);
            }
        } else {
            for i in 0..CUBE_DIM / PLANE_DIM {
                out = max(out, shared[i as usize]);
            }
        }
    } else {
        let mut shared = Shared::<[f32]>::new_slice(comptime![plan.cube_dim as usize]);
        shared[UNIT_POS as usize] = value;
        sync_cube();
        #[unroll]
        for step in 0..plan.tree_steps() {
            let stride = comptime![(plan.cube_dim >> (step + 1)) as usize];
            if (UNIT_POS as usize) < stride {
                let other = shared[UNIT_POS as usize + stride];
                shared[UNIT_POS as usize] = max(shared[UNIT_POS as usize], other);
            }
            sync_cube();
        }
        out = shared[0];
    }
    out
}

/// Sum of the lanes of a vector, in f32.
#[cube]
pub fn vector_sum<F: Float, N: Size>(v: Vector<F, N>) -> f32 {
    let mut s = 0f32;
    #[unroll]
    for i in 0..v.vector_size() {
        s += f32::cast_from(v.extract(i));
    }
    s
}
