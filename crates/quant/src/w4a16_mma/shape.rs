//! The launch shape of the int4 tensor-core GEMV: warps per tile, steps per pass, and the
//! chunks x is staged in.

use super::{MAX_LOADS, MAX_WARPS, MIN_CUBE_WARPS, STAGE_MAX_BYTES, STEP_K, WARPS_PER_SM};

/// What a decode GEMV's launch takes of the device: its SM count and programmatic dependent
/// launch (`ops::caps::has_pdl`, `has_launch_dependents`). Shared with the 8-bit
/// float-activation GEMV.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SmDevice {
    pub sms: usize,
    pub pdl: bool,
    pub trigger: bool,
}

impl SmDevice {
    pub fn of<R: cubecl::prelude::Runtime>(client: &cubecl::prelude::ComputeClient<R>) -> Self {
        Self {
            sms: ops::caps::num_sms(client) as usize,
            pdl: ops::caps::has_pdl(client),
            trigger: ops::caps::has_launch_dependents(client),
        }
    }

    /// An sm_90 device as the CUDA runtime reports an H100 or H200 (for the tests that build
    /// CUDA sources without one).
    #[cfg(test)]
    pub const SM90: Self = Self {
        sms: 132,
        pdl: true,
        trigger: true,
    };
}

/// How [`super::gemv_mma`] lays out its launch for `m` rows of x, `steps` 128-k steps and `tiles`
/// tiles of 16 output columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LaunchShape {
    /// Warps per tile, over interleaved steps.
    pub warps: usize,
    /// Tiles per cube.
    pub per_cube: usize,
    /// Steps per pass of a lane.
    pub batch: usize,
    /// Chunks x is staged in, of `chunk_passes` passes (`chunk_steps` steps) each.
    pub chunks: usize,
    pub chunk_passes: usize,
    pub chunk_steps: usize,
}

/// Warps per tile and steps per pass of a tensor-core decode GEMV whose tiles are 16 weight rows
/// (two per lane) with x staged whole: for `m` rows of x, `steps` steps and `tiles` tiles on
/// `sms` SMs, a lane issuing at most `max_loads` 16-byte weight loads per pass. Shared by the
/// int4 GEMV and the 8-bit one on the float activation (`crate::gemm8::float_x`).
pub(crate) fn tile_warps(
    m: usize,
    steps: usize,
    tiles: usize,
    sms: usize,
    gated: bool,
    max_loads: usize,
) -> (usize, usize) {
    // Above 8 rows a warp's partial sums are twice as many: half as many warps keep them
    // within RED_MAX_BYTES.
    let max_warps = if m > 8 { MAX_WARPS / 2 } else { MAX_WARPS };
    // Warps per tile: enough for about WARPS_PER_SM warps per SM over the grid, but a power of
    // two no larger than the steps, so that every warp has a step (12 steps had taken 16 warps,
    // 4 of them holding registers and joining the barriers for nothing: with 8, the 1.5B
    // model's qkv and o projections decoded W4A16 1.4% faster on an H200, 1 209.2 against
    // 1 192.8 tok/s, medians of two rounds in one call; 4 warps of 3 steps gave 1 202.3).
    let whole_steps = 1 << steps.max(1).ilog2();
    let warps = (WARPS_PER_SM * sms)
        .div_ceil(tiles)
        .next_power_of_two()
        .min(whole_steps)
        .clamp(1, max_warps);
    let halves = if gated { 2 } else { 1 };
    (
        warps,
        steps.div_ceil(warps).clamp(1, max_loads / (2 * halves)),
    )
}

impl LaunchShape {
    pub fn new(m: usize, steps: usize, tiles: usize, sms: usize, gated: bool) -> Self {
        // Tiles per cube up to MIN_CUBE_WARPS warps.
        let (mut warps, mut batch) = tile_warps(m, steps, tiles, sms, gated, MAX_LOADS);
        // Steps of x that fit the stage: all of K (one chunk, the pass count as it comes), or
        // chunks of whole passes, with fewer warps and loads per pass if one pass would not fit.
        let fit = STAGE_MAX_BYTES / (m.max(1) * STEP_K * 2);
        let passes = steps.div_ceil(warps * batch);
        if steps <= fit {
            return Self {
                warps,
                per_cube: (MIN_CUBE_WARPS / warps).max(1),
                batch,
                chunks: 1,
                chunk_passes: passes,
                chunk_steps: steps,
            };
        }
        while warps > 1 && warps > fit {
            warps /= 2;
        }
        batch = batch.min(fit / warps).max(1);
        let per_pass = warps * batch;
        let chunk_passes = fit / per_pass;
        let chunk_steps = chunk_passes * per_pass;
        Self {
            warps,
            per_cube: (MIN_CUBE_WARPS / warps).max(1),
            batch,
            chunks: steps.div_ceil(chunk_steps),
            chunk_passes,
            chunk_steps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MAX_LOADS, STAGE_MAX_BYTES, STEP_K};
    use super::LaunchShape;

    /// Every launch shape stages at most [`STAGE_MAX_BYTES`] of x, in chunks of whole passes
    /// that cover K, and where all of K fits the shape is the one-chunk rule.
    #[test]
    fn launch_shapes_stage_within_bounds() {
        for m in 1..=16usize {
            for k in [128usize, 384, 1536, 4480, 8960, 14336, 18944] {
                for tiles in [3usize, 96, 128, 560, 9496] {
                    for gated in [false, true] {
                        let steps = k.div_ceil(STEP_K);
                        let s = LaunchShape::new(m, steps, tiles, 132, gated);
                        let what = format!("m {m} k {k} tiles {tiles} gated {gated}: {s:?}");
                        assert!(m * s.chunk_steps * STEP_K * 2 <= STAGE_MAX_BYTES, "{what}");
                        assert!(s.chunks * s.chunk_steps >= steps, "{what}");
                        assert!(
                            s.chunk_passes >= 1 && s.warps >= 1 && s.batch >= 1,
                            "{what}"
                        );
                        assert!(s.batch * 2 * (1 + gated as usize) <= MAX_LOADS, "{what}");
                        assert!(s.warps.is_power_of_two() && s.warps <= steps, "{what}");
                        let per_pass = s.warps * s.batch;
                        if s.chunks == 1 {
                            assert_eq!(s.chunk_steps, steps, "{what}");
                            assert_eq!(s.chunk_passes, steps.div_ceil(per_pass), "{what}");
                        } else {
                            assert_eq!(s.chunk_steps, s.chunk_passes * per_pass, "{what}");
                            assert!((s.chunks - 1) * s.chunk_steps < steps, "{what}");
                        }
                        let fits = m * steps * STEP_K * 2 <= STAGE_MAX_BYTES;
                        assert_eq!(s.chunks == 1, fits, "{what}");
                    }
                }
            }
        }
    }
}
