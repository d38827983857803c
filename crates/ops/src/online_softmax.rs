//! The online-softmax statistics shared by [`crate::softmax`] and attention.
//!
//! A running `(max, sum)` pair over a stream of logits: adding a value rescales the sum when the
//! max grows, and two partial pairs merge the same way. One pass over the data gives both
//! statistics (Milakov & Gimelshein, 2018), which is what flash attention builds on.

use cubecl::prelude::*;

/// Running softmax statistics: `sum = Σ exp(x_i - max)`.
#[derive(CubeType, Clone, Copy)]
pub struct SoftmaxStats {
    pub max: f32,
    pub sum: f32,
}

#[cube]
impl SoftmaxStats {
    /// The empty statistics (max = -inf, sum = 0).
    pub fn empty() -> SoftmaxStats {
        SoftmaxStats {
            max: f32::new(f32::NEG_INFINITY),
            sum: 0f32,
        }
    }
}

/// Adds one logit to running statistics.
#[cube]
pub fn stats_push(stats: SoftmaxStats, x: f32) -> SoftmaxStats {
    let new_max = max(stats.max, x);
    // exp(-inf - -inf) would be NaN: an empty side contributes nothing.
    let old_scale = select(
        stats.max == f32::new(f32::NEG_INFINITY),
        0f32,
        f32::exp(stats.max - new_max),
    );
    let add = select(
        x == f32::new(f32::NEG_INFINITY),
        0f32,
        f32::exp(x - new_max),
    );
    SoftmaxStats {
        max: new_max,
        sum: stats.sum * old_scale + add,
    }
}

/// Merges two partial statistics.
#[cube]
pub fn stats_merge(a: SoftmaxStats, b: SoftmaxStats) -> SoftmaxStats {
    let new_max = max(a.max, b.max);
    let sa = select(
        a.max == f32::new(f32::NEG_INFINITY),
        0f32,
        f32::exp(a.max - new_max),
    );
    let sb = select(
        b.max == f32::new(f32::NEG_INFINITY),
        0f32,
        f32::exp(b.max - new_max),
    );
    SoftmaxStats {
        max: new_max,
        sum: a.sum * sa + b.sum * sb,
    }
}

/// The factor that rescales a quantity accumulated under `old_max` to `new_max`
/// (`exp(old_max - new_max)`, 0 when nothing was accumulated yet).
#[cube]
pub fn rescale_factor(old_max: f32, new_max: f32) -> f32 {
    select(
        old_max == f32::new(f32::NEG_INFINITY),
        0f32,
        f32::exp(old_max - new_max),
    )
}
