//! The float-activation GEMV's launch plan: warps per tile, tiles per cube and steps per pass,
//! one cube per tile group.

use ops::gemm::EpilogueBlueprint;
use ops::reduce::ReducePlan;

use crate::tile_sums::TileSums;
use crate::w4a16_mma::{tile_warps, SmDevice, MIN_CUBE_WARPS, TILE_N};

/// K per step: a quad's four lanes x 16 codes.
pub(super) const STEP_K: usize = 64;
/// 16-byte weight loads a lane issues before the first is used (two rows per step, two more
/// when gated): 9 steps of an ungated launch, so that the 1.5B model's down projection (140
/// steps over 16 warps per tile) loads its whole K in one pass before the kernel waits, 4 of a
/// gated one (gate-up: 24 steps over 8 warps, 3 each).
pub(super) const MAX_LOADS: usize = 18;
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

/// The kernel's comptime plan, units per cube and cube count (one per tile group) for `shape`
/// on `device`, with the cube reduction `reduce` gives for a cube of that many units.
pub(super) fn launch_plan(
    shape: Shape,
    device: SmDevice,
    reduce: impl Fn(u32) -> ReducePlan,
) -> (FloatXPlan, u32, u32) {
    let steps = shape.k.div_ceil(STEP_K);
    let tiles = shape.n.div_ceil(TILE_N);
    let gated = shape.epilogue.is_gated();
    let [warps, per_cube, batch] = launch_shape(shape.m, steps, tiles, device.sms, gated);
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
    };
    (plan, units, tiles.div_ceil(per_cube) as u32)
}

#[cfg(test)]
mod tests {
    use super::{launch_plan, launch_shape, Shape, MAX_LOADS, STEP_K, TILE_N};
    use crate::w4a16_mma::SmDevice;
    use crate::w4a16_mma::RED_MAX_BYTES;
    use ops::gemm::EpilogueBlueprint;
    use ops::matmul::Activation;
    use testkit::cuda_source::sm90_reduce;

    /// The 1.5B model's four projections at one row on an H100 or H200 take the launches whose
    /// decode step was measured fastest: qkv 128 cubes and o 96 of 512 units, gate-up 560 of
    /// 256 (one per tile group, 2.1 waves), down 96 of 512.
    #[test]
    fn model_projections_launch_one_cube_per_tile_group() {
        for (k, n, gated, norm, units, cubes) in [
            (1536, 2048, false, true, 512, 128),
            (1536, 1536, false, false, 512, 96),
            (1536, 8960, true, true, 256, 560),
            (8960, 1536, false, false, 512, 96),
        ] {
            let epilogue = if gated {
                EpilogueBlueprint::gated(Activation::Silu)
            } else {
                EpilogueBlueprint::linear(true, true)
            };
            let shape = Shape {
                m: 1,
                k,
                n,
                fp8: false,
                epilogue,
                norm,
            };
            let (_, u, c) = launch_plan(shape, SmDevice::SM90, sm90_reduce);
            assert_eq!((u, c), (units, cubes), "{k} x {n}");
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
