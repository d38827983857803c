//! The online-softmax statistics shared by [`crate::softmax`] and attention.
//!
//! A running pair `(max, sum)` with `sum = Σ exp(x_i - max)` over a stream of logits: when the
//! max grows, the sum (and anything accumulated with the same weights, such as attention's
//! output) is rescaled by `exp(old_max - new_max)`. One pass gives both statistics (Milakov &
//! Gimelshein, 2018), which is what flash attention builds on. Kept as scalar functions because
//! CubeCL's loop-carried variables are scalars: callers hold `max` and `sum` in two variables.
//!
//! ```ignore
//! let mut m = f32::new(f32::MIN); // STATS_EMPTY_MAX, not -inf (WGSL has no inf literal)
//! let mut s = 0f32;
//! // for each logit x (masked ones may be -inf):
//! let new_max = max(m, x);
//! s = s * rescale_factor(m, new_max) + exp_shifted(x, new_max);
//! m = new_max;
//! ```
//!
//! Starting from `f32::MIN` rather than `-inf` also keeps the arithmetic free of `-inf - -inf`:
//! a fully masked stream keeps `max = f32::MIN` and `sum = 0`.

use cubecl::prelude::*;

/// The initial running max: the lowest finite f32.
pub const STATS_EMPTY_MAX: f32 = f32::MIN;

/// `exp(old_max - new_max)`: rescales what was accumulated under `old_max`.
#[cube]
pub fn rescale_factor(old_max: f32, new_max: f32) -> f32 {
    f32::exp(old_max - new_max)
}

/// `exp(x - max)` (0 for a masked `x = -inf`).
#[cube]
pub fn exp_shifted(x: f32, max: f32) -> f32 {
    f32::exp(x - max)
}

/// The sum of two partial statistics `(ma, sa)` and `(mb, sb)` expressed under `max(ma, mb)`.
#[cube]
pub fn merged_sum(ma: f32, sa: f32, mb: f32, sb: f32) -> f32 {
    let m = max(ma, mb);
    sa * rescale_factor(ma, m) + sb * rescale_factor(mb, m)
}

/// The "no score" value of the attention kernels: masked scores and "nothing seen yet" maxima.
/// Unlike [`STATS_EMPTY_MAX`] it is far from the f32 range's end, so `x - max` stays finite
/// whatever the scores; real scores are many orders of magnitude above it.
pub const EMPTY_MAX: f32 = -1.0e30;

/// `exp(x - max)`, or 0 when `x` is [`EMPTY_MAX`] (or below): the weight of a score (0 when
/// masked) and the factor that rescales sums accumulated under an old max `x` to a new max (0
/// when nothing was accumulated, which also avoids `exp(0) = 1` when both are empty).
#[cube]
pub fn exp_or_zero(x: f32, max: f32) -> f32 {
    select(x <= f32::new(EMPTY_MAX), 0f32, f32::exp(x - max))
}
