//! The launch shape of the int4 tensor-core GEMV: warps per tile, steps per pass, and the
//! chunks x is staged in.

use super::{MAX_LOADS, MAX_WARPS, MIN_CUBE_WARPS, STAGE_MAX_BYTES, STEP_K, WARPS_PER_SM};

/// Loads a lane of a [`LaunchShape::beside`] launch may issue in its one pass: 18 16-byte loads
/// are 72 registers, under the 128 a unit of a half-SM cube of 256 units may take.
const BESIDE_MAX_LOADS: usize = 18;

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
    /// The cubes take at most half an SM's registers (the launch asks the compiler for two per
    /// SM), so that they start beside a cube of the launch before: a plain launch of at most one
    /// cube per SM whose steps are many (the 1.5B model's down projection: 96 tiles, 70 steps),
    /// in 8 warps that load all their steps in one pass. At 16 warps its units took 128
    /// registers, a whole SM's, so its cubes waited for SMs that the gated launch before (three
    /// persistent cubes per SM) had left entirely.
    pub beside: bool,
}

impl LaunchShape {
    pub fn new(m: usize, steps: usize, tiles: usize, sms: usize, gated: bool) -> Self {
        // Above 8 rows a warp's partial sums are twice as many: half as many warps keep them
        // within RED_MAX_BYTES.
        let max_warps = if m > 8 { MAX_WARPS / 2 } else { MAX_WARPS };
        // Warps per tile: enough for about WARPS_PER_SM warps per SM over the grid, at most one
        // per step; tiles per cube up to MIN_CUBE_WARPS warps.
        let mut warps = (WARPS_PER_SM * sms)
            .div_ceil(tiles)
            .min(steps)
            .next_power_of_two()
            .clamp(1, max_warps);
        let halves = if gated { 2 } else { 1 };
        let mut batch = steps.div_ceil(warps).clamp(1, MAX_LOADS / (2 * halves));
        // Steps of x that fit the stage: all of K (one chunk, the pass count as it comes), or
        // chunks of whole passes, with fewer warps and loads per pass if one pass would not fit.
        let fit = STAGE_MAX_BYTES / (m.max(1) * STEP_K * 2);
        let half = MAX_WARPS / 2;
        let beside = !gated
            && m <= 8
            && steps <= fit
            && tiles <= sms
            && warps > half
            && batch > 2
            && steps.div_ceil(half) * 2 <= BESIDE_MAX_LOADS;
        if beside {
            warps = half;
            batch = steps.div_ceil(half);
        }
        let passes = steps.div_ceil(warps * batch);
        if steps <= fit {
            return Self {
                warps,
                per_cube: (MIN_CUBE_WARPS / warps).max(1),
                batch,
                chunks: 1,
                chunk_passes: passes,
                chunk_steps: steps,
                beside,
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
            beside: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MAX_LOADS, STAGE_MAX_BYTES, STEP_K};
    use super::{LaunchShape, BESIDE_MAX_LOADS};

    /// The 1.5B model's projections at one row on 132 SMs: down (96 tiles, 70 steps) runs
    /// beside the launch before, in 8 warps of 9 steps; qkv, o and gate-up keep their shapes.
    #[test]
    fn the_down_projection_runs_beside() {
        let down = LaunchShape::new(1, 70, 96, 132, false);
        assert!(down.beside, "{down:?}");
        assert_eq!((down.warps, down.batch, down.chunk_passes), (8, 9, 1));
        for (tiles, gated, warps, batch) in
            [(128, false, 16, 1), (96, false, 16, 1), (560, true, 8, 2)]
        {
            let s = LaunchShape::new(1, 12, tiles, 132, gated);
            assert!(!s.beside, "{s:?}");
            assert_eq!((s.warps, s.batch), (warps, batch), "{s:?}");
        }
        // More tiles than SMs, or rows past 8: the plain shape.
        assert!(!LaunchShape::new(1, 70, 140, 132, false).beside);
        assert!(!LaunchShape::new(9, 70, 96, 132, false).beside);
    }

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
                        let loads = s.batch * 2 * (1 + gated as usize);
                        if s.beside {
                            assert!(!gated && m <= 8 && tiles <= 132, "{what}");
                            assert_eq!((s.warps, s.chunks, s.chunk_passes), (8, 1, 1), "{what}");
                            assert!(loads <= BESIDE_MAX_LOADS, "{what}");
                        } else {
                            assert!(loads <= MAX_LOADS, "{what}");
                        }
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
