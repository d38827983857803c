//! BSR construction and the dense x block-sparse matmul against dense f64 references.

mod format;
mod layer;
mod linear;
mod linear_errors;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use testkit::*;

/// A block mask with exactly `round(density * blocks)` blocks present, at random places.
pub(super) fn random_mask(rng: &mut StdRng, rows: usize, cols: usize, density: f64) -> Vec<bool> {
    let total = rows * cols;
    let keep = ((density * total as f64).round() as usize).min(total);
    let mut mask: Vec<bool> = (0..total).map(|i| i < keep).collect();
    mask.shuffle(rng);
    mask
}

/// A dense `[n, k]` matrix whose present blocks hold random values in [-1, 1] (never all zero)
/// and whose absent blocks are zero.
pub(super) fn blocky(rng: &mut StdRng, shape: [usize; 2], b: usize, mask: &[bool]) -> Vec<f32> {
    let cols = shape[1] / b;
    let vals = random(rng, shape[0] * shape[1], 1.0);
    let mut dense = vec![0f32; shape[0] * shape[1]];
    for n in 0..shape[0] {
        for k in 0..shape[1] {
            if mask[(n / b) * cols + k / b] {
                dense[n * shape[1] + k] = if vals[n * shape[1] + k] == 0.0 {
                    0.5
                } else {
                    vals[n * shape[1] + k]
                };
            }
        }
    }
    dense
}
