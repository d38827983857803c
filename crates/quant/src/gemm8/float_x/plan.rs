//! The float-activation GEMV's launch plan: warps per tile, steps per pass, tile groups walked
//! by a persistent wave of cubes (gated) or split across a cluster (a long K on few tiles).

use cubecl::prelude::{ComputeClient, Runtime};
use ops::gemm::EpilogueBlueprint;
use ops::reduce::ReducePlan;

use crate::tile_sums::TileSums;
use crate::w4a16_mma::{resident_cubes, tile_warps, SmDevice, MIN_CUBE_WARPS, TILE_N};

/// K per step: a quad's four lanes x 16 codes.
pub(super) const STEP_K: usize = 64;
/// 16-byte weight loads a lane issues before the first is used (two rows per step, two more
/// when gated): 9 steps of an ungated launch, so that the 1.5B model's down projection (140
/// steps over 16 warps per tile) loads its whole K in one pass before the kernel waits, 4 of a
/// gated one (gate-up: 24 steps over 8 warps, 3 each).
pub(super) const MAX_LOADS: usize = 18;
/// Cubes a tile group's K is split across where it is: a cluster of two 256-unit cubes per
/// tile for the 1.5B model's down projection (96 tiles), where one 512-unit cube took an SM's
/// whole register file (see the module doc).
pub(super) const K_SPLIT: usize = 2;
/// Fewest steps (64 k each) of a split launch: shorter products are bound by their fixed cost,
/// which the split's exchange would lengthen.
const SPLIT_MIN_STEPS: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct FloatXPlan {
    /// Rows of x (at most 16: two MMAs of 8 x rows).
    pub(super) m: u32,
    /// Warps per tile, over interleaved steps.
    pub(super) warps: u32,
    /// Tiles per cube.
    pub(super) tiles: u32,
    /// Steps per pass of a lane (all loaded before the first is used).
    pub(super) batch: u32,
    /// Staged 16-byte words (8 k each) per x row: K in whole steps.
    pub(super) row_words: u32,
    /// e4m3 weights (else int8).
    pub(super) fp8: bool,
    pub(super) epilogue: EpilogueBlueprint,
    /// x goes through an RMSNorm first.
    pub(super) norm: bool,
    pub(super) reduce: ReducePlan,
    /// Load the first pass's weights before `griddepcontrol.wait` (`ops::caps::has_pdl`).
    pub(super) early_wait: bool,
    /// Signal `griddepcontrol.launch_dependents` (with `early_wait`, once the first pass's
    /// weight loads are issued, as the int4 GEMV does).
    pub(super) trigger: bool,
    /// One wave of cubes, this many per SM, each walking tile groups `CUBE_POS`, then every
    /// cube count on: x is staged once per cube and the next group's weights load while a
    /// group is reduced and written (a gated launch of more groups than one wave holds).
    pub(super) persistent: Option<u32>,
    /// Cubes per tile group, each taking every `k_split`-th run of `warps` steps: a cluster of
    /// that many cubes, which add their sums through global memory behind the cluster barrier
    /// (an ungated launch of a long K on fewer tiles than SMs, [`K_SPLIT`]), else 1.
    pub(super) k_split: u32,
}

impl FloatXPlan {
    pub(super) fn halves(&self) -> usize {
        self.tile_sums().halves as usize
    }

    /// MMAs per weight fragment: x rows 0..8, and 8..16 above 8 rows.
    pub(super) fn x_halves(&self) -> usize {
        self.tile_sums().x_halves as usize
    }

    /// How the warps' partial sums are laid out in shared memory.
    pub(super) fn tile_sums(&self) -> TileSums {
        TileSums::new(self.m, self.warps, self.tiles, self.epilogue.is_gated())
    }
}

/// Warps per tile, tiles per cube and steps per pass for `m` rows, `steps` steps and `tiles`
/// tiles of 16 columns on `sms` SMs (the int4 GEMV's rules for x staged whole).
pub(super) fn launch_shape(
    m: usize,
    steps: usize,
    tiles: usize,
    sms: usize,
    gated: bool,
) -> [usize; 3] {
    let (warps, batch) = tile_warps(m, steps, tiles, sms, gated, MAX_LOADS);
    [warps, (MIN_CUBE_WARPS / warps).max(1), batch]
}

/// What a launch is for: `m` rows of x over `k` features into `n` output columns, the weight's
/// format, the epilogue and the input norm.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) m: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) fp8: bool,
    pub(super) epilogue: EpilogueBlueprint,
    pub(super) norm: bool,
}

/// The kernel's comptime plan, units per cube and cube count for `shape` on `device`, with the
/// cube reduction `reduce` gives for a cube of that many units; `scratch` f32s of a
/// split-K scratch are at hand for a K split's partial sums.
pub(super) fn launch_plan(
    shape: Shape,
    device: SmDevice,
    scratch: usize,
    reduce: impl Fn(u32) -> ReducePlan,
) -> (FloatXPlan, u32, u32) {
    let steps = shape.k.div_ceil(STEP_K);
    let tiles = shape.n.div_ceil(TILE_N);
    let gated = shape.epilogue.is_gated();
    let [warps, per_cube, batch] = launch_shape(shape.m, steps, tiles, device.sms, gated);
    // The plan of `warps` warps per tile and `per_cube` tiles per cube (the same steps per
    // pass), its units and tile groups.
    let plan_for = |warps: usize, per_cube: usize, persistent: Option<u32>, k_split: usize| {
        let units = (32 * warps * per_cube) as u32;
        let plan = FloatXPlan {
            m: shape.m as u32,
            warps: warps as u32,
            tiles: per_cube as u32,
            batch: batch as u32,
            row_words: (steps * STEP_K / 8) as u32,
            fp8: shape.fp8,
            epilogue: shape.epilogue,
            norm: shape.norm,
            reduce: reduce(units),
            early_wait: device.pdl,
            trigger: device.trigger,
            persistent,
            k_split: k_split as u32,
        };
        (plan, units, tiles.div_ceil(per_cube))
    };
    // Split: the tile's warps shared by the cluster's cubes.
    let split = !gated && device.clusters && tiles < device.sms && steps >= SPLIT_MIN_STEPS;
    if split && warps >= K_SPLIT {
        let half = warps / K_SPLIT;
        let (plan, units, groups) = plan_for(half, (MIN_CUBE_WARPS / half).max(1), None, K_SPLIT);
        if groups * split_len(&plan) <= scratch {
            return (plan, units, (groups * K_SPLIT) as u32);
        }
    }
    // Gated tile groups past one wave (the 1.5B model's gate-up: 560 groups where 2 cubes of
    // 256 units at the uncapped 98 registers fit an SM): cubes for one wave at the int4 GEMV's
    // count per SM, each walking several groups.
    let resident = resident_cubes(32 * warps * per_cube, shape.m);
    let wave = device.sms * resident;
    let persistent = gated && tiles.div_ceil(per_cube) > wave && resident <= 6;
    let (plan, units, groups) = plan_for(warps, per_cube, persistent.then_some(resident as u32), 1);
    (plan, units, if persistent { wave } else { groups } as u32)
}

/// f32 partial sums an ungated `[n, k]` launch for `m` rows leaves in the split-K scratch where
/// it splits K (0 where it does not).
pub(crate) fn split_partials<R: Runtime>(
    client: &ComputeClient<R>,
    m: usize,
    k: usize,
    n: usize,
) -> usize {
    let shape = Shape {
        m,
        k,
        n,
        fp8: false,
        epilogue: EpilogueBlueprint::linear(false, false),
        norm: false,
    };
    let reduce = |units| ReducePlan::new(client, units);
    let (plan, _, cubes) = launch_plan(shape, SmDevice::of(client), usize::MAX, reduce);
    cubes as usize / plan.k_split as usize * split_len(&plan)
}

/// f32 partial sums a tile group of `plan` leaves in the split-K scratch.
pub(super) fn split_len(plan: &FloatXPlan) -> usize {
    (plan.k_split.max(1) as usize - 1) * plan.tile_sums().shared_len()
}

#[cfg(test)]
mod tests {
    use super::{launch_plan, launch_shape, FloatXPlan, Shape, MAX_LOADS, STEP_K, TILE_N};
    use crate::w4a16_mma::SmDevice;
    use crate::w4a16_mma::RED_MAX_BYTES;
    use ops::gemm::EpilogueBlueprint;
    use ops::matmul::Activation;
    use testkit::cuda_source::sm90_reduce;

    /// The plan, units and cubes of an int8 `[m, k] x [n, k]` launch on an H100 or H200 with
    /// `scratch` f32s of split-K scratch: gated with SiLU, or with bias and residual.
    fn plan_on_sm90(
        [m, k, n]: [usize; 3],
        gated: bool,
        norm: bool,
        scratch: usize,
    ) -> (FloatXPlan, u32, u32) {
        let epilogue = if gated {
            EpilogueBlueprint::gated(Activation::Silu)
        } else {
            EpilogueBlueprint::linear(true, true)
        };
        let shape = Shape {
            m,
            k,
            n,
            fp8: false,
            epilogue,
            norm,
        };
        launch_plan(shape, SmDevice::SM90, scratch, sm90_reduce)
    }

    /// Only a gated launch of more tile groups than one wave walks groups: the 1.5B model's
    /// gate-up on 132 SMs (560 groups; 3 cubes of 256 units per SM at one row, 2 at 16), not
    /// its qkv, o or down, nor a gate-up of few groups.
    #[test]
    fn gated_launches_past_one_wave_walk_groups() {
        let plan = |m, k, n, gated| {
            let (plan, units, cubes) = plan_on_sm90([m, k, n], gated, true, 0);
            (plan.persistent, units, cubes)
        };
        assert_eq!(plan(1, 1536, 8960, true), (Some(3), 256, 396));
        // Above 8 rows twice the accumulators: 2 cubes per SM.
        assert_eq!(plan(16, 1536, 8960, true), (Some(2), 256, 264));
        assert_eq!(plan(1, 1536, 2048, true).0, None);
        for (k, n) in [(1536, 2048), (1536, 1536), (8960, 1536)] {
            assert_eq!(plan(1, k, n, false).0, None, "{k} x {n}");
        }
    }

    /// Only a long K on fewer tiles than SMs splits across a cluster, and only with room for
    /// the partial sums: the 1.5B model's down projection (96 tiles, 140 steps) at one row on
    /// two cubes of 256 units per tile, not its qkv or o (24 steps) nor gate-up.
    #[test]
    fn long_k_on_few_tiles_splits_across_a_cluster() {
        let plan = |m, k, n, gated, scratch| {
            let (plan, units, cubes) = plan_on_sm90([m, k, n], gated, false, scratch);
            (plan.k_split, units, cubes, super::split_len(&plan))
        };
        let (split, units, cubes, len) = plan(1, 8960, 1536, false, usize::MAX);
        assert_eq!((split, units, cubes), (2, 256, 192));
        // One group's partials: 8 warps of 16 columns x 8 x rows.
        assert_eq!(len, 8 * 16 * 8);
        assert_eq!(plan(1, 8960, 1536, false, 96 * len).0, 2);
        let (split, units, cubes, _) = plan(1, 8960, 1536, false, 96 * len - 1);
        assert_eq!((split, units, cubes), (1, 512, 96));
        assert_eq!(plan(16, 8960, 1536, false, usize::MAX).0, 2);
        for (k, n, gated) in [(1536, 2048, false), (1536, 1536, false), (1536, 8960, true)] {
            assert_eq!(plan(1, k, n, gated, usize::MAX).0, 1, "{k} x {n}");
        }
    }

    /// The shapes the CUDA kernel tests (`linear8_float_x`) run for the persistent and the split
    /// launches take those launches on an H100 or H200, with partial tiles and steps: gated
    /// (5, 8500, 1552) and (16, 5000, 1552) walk groups (532 on 3 cubes per SM; 313 on 2),
    /// ungated (1, 50, 4112) and (7, 1500, 4176) split K across a cluster, with and without
    /// the input norm.
    #[test]
    fn kernel_test_shapes_take_the_launches_they_test() {
        for (m, n, k, resident, cubes) in [(5, 8500, 1552, 3, 396), (16, 5000, 1552, 2, 264)] {
            for norm in [false, true] {
                let (p, _, launched) = plan_on_sm90([m, k, n], true, norm, 0);
                let what = format!("{m}x{n}x{k} norm {norm}");
                assert_eq!((p.persistent, launched), (Some(resident), cubes), "{what}");
                assert!(n.div_ceil(TILE_N * p.tiles as usize) > cubes as usize);
            }
            assert_ne!(k % STEP_K, 0);
        }
        for (m, n, k) in [(1, 50, 4112), (7, 1500, 4176)] {
            for norm in [false, true] {
                let (p, _, _) = plan_on_sm90([m, k, n], false, norm, usize::MAX);
                assert_eq!(p.k_split, 2, "{m}x{n}x{k} norm {norm}");
            }
            assert!(n % TILE_N != 0 && k % STEP_K != 0);
        }
    }

    /// Every launch shape gives each warp a step, keeps a lane's loads within [`MAX_LOADS`] and
    /// the warps' partial sums within [`RED_MAX_BYTES`].
    #[test]
    fn launch_shapes_stay_within_bounds() {
        for m in 1..=16usize {
            for k in [64usize, 1536, 4480, 8960] {
                for tiles in [1usize, 96, 128, 560, 9496] {
                    for gated in [false, true] {
                        let steps = k.div_ceil(STEP_K);
                        let [warps, per_cube, batch] = launch_shape(m, steps, tiles, 132, gated);
                        let what = format!("m {m} k {k} tiles {tiles} gated {gated}");
                        let halves = 1 + gated as usize;
                        let x_halves = if m > 8 { 2 } else { 1 };
                        assert!(warps.is_power_of_two() && warps <= steps, "{what}");
                        assert!(batch >= 1 && batch * 2 * halves <= MAX_LOADS, "{what}");
                        assert!(per_cube.is_power_of_two(), "{what}");
                        let red = warps * per_cube * TILE_N * 8 * x_halves * halves * 4;
                        assert!(red <= RED_MAX_BYTES, "{what}");
                    }
                }
            }
        }
        // The 1.5B model at one row: qkv, o, gate-up (gated) and down each load their whole
        // K in one pass.
        for (k, n, gated) in [
            (1536, 2048, false),
            (1536, 1536, false),
            (1536, 8960, true),
            (8960, 1536, false),
        ] {
            let steps = k / STEP_K;
            let [warps, _, batch] = launch_shape(1, steps, n / TILE_N, 132, gated);
            assert!(warps * batch >= steps, "k {k} n {n}: {warps} x {batch}");
        }
    }
}
