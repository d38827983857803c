//! Reference of `ops::sampling`: the kept set and the draw of one row, in f64.
//!
//! The semantics are the host sampler's (`model::sampling`, transformers' order): repetition
//! penalty, temperature, top-k, top-p over the top-k set renormalised, then a draw from the
//! kept set renormalised, walking the kept ids in ascending id order and taking the first whose
//! cumulative probability exceeds `u`. Ties in value are broken by the lower id; NaN and `-inf`
//! logits are never kept; temperature 0 (or top-k 1) keeps only the first maximum.
//!
//! The penalty is applied in f32, exactly as the host sampler and the kernels apply it, so that
//! the order of the logits (which top-k and the ties depend on) is the device's; everything
//! after it is f64.

use crate::sampling::RowParams;

/// The penalised logit of one token, in f32 (the host sampler's rule: positive logits are
/// divided by the penalty, the others multiplied).
pub fn penalized(logit: f32, present: bool, penalty: f32) -> f32 {
    if !present || penalty == 1.0 {
        logit
    } else if logit > 0.0 {
        logit / penalty
    } else {
        logit * penalty
    }
}

/// The kept set of one row and its renormalised distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// Kept ids in ascending order (the draw's order).
    pub ids: Vec<u32>,
    /// Their probabilities, renormalised over the kept set.
    pub probs: Vec<f64>,
    /// Cumulative probability up to and including each id (the last is 1 up to rounding).
    pub cum: Vec<f64>,
    /// How far the top-p decision is from flipping: the distance of `top_p` to the cumulative
    /// (descending) mass of the kept prefix and of the prefix one shorter; `f64::INFINITY` when
    /// top-p is off. A sampler whose masses differ by less than this keeps the same set.
    pub top_p_margin: f64,
}

impl Kept {
    /// The reference's choice for the uniform `u`: the first kept id whose cumulative
    /// probability exceeds `u`, else (rounding) the last.
    pub fn choose(&self, u: f64) -> Option<u32> {
        let i = self
            .cum
            .iter()
            .position(|&c| u < c)
            .unwrap_or(self.ids.len().checked_sub(1)?);
        Some(self.ids[i])
    }

    /// The interval `[cumulative before, cumulative after)` of `id` in the draw, if kept.
    pub fn interval(&self, id: u32) -> Option<(f64, f64)> {
        let i = self.ids.binary_search(&id).ok()?;
        let before = if i == 0 { 0.0 } else { self.cum[i - 1] };
        Some((before, self.cum[i]))
    }
}

/// The kept set of the logits of one row (`present[i]`: token `i` is in the context, for the
/// penalty). Empty when no logit is a number above `-inf`.
pub fn kept(logits: &[f64], present: &[bool], p: RowParams) -> Kept {
    let values: Vec<f32> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            penalized(
                l as f32,
                present.get(i).copied().unwrap_or(false),
                p.repetition_penalty,
            )
        })
        .collect();
    // Candidates in (value descending, id ascending) order; -0 and +0 are the same value.
    let mut order: Vec<u32> = (0..values.len() as u32)
        .filter(|&i| {
            let v = values[i as usize];
            !v.is_nan() && v != f32::NEG_INFINITY
        })
        .collect();
    order.sort_by(|&a, &b| {
        let (va, vb) = (values[a as usize] as f64, values[b as usize] as f64);
        vb.partial_cmp(&va).expect("no NaN").then(a.cmp(&b))
    });
    let mut top_p_margin = f64::INFINITY;
    if p.temperature == 0.0 || p.top_k == 1 {
        order.truncate(1);
    } else {
        if p.top_k > 0 && (p.top_k as usize) < order.len() {
            order.truncate(p.top_k as usize);
        }
        if p.top_p < 1.0 && !order.is_empty() {
            let max = values[order[0] as usize] as f64;
            let t = p.temperature as f64;
            let w: Vec<f64> = order
                .iter()
                .map(|&i| weight(values[i as usize] as f64, max, t))
                .collect();
            let z: f64 = w.iter().sum();
            let target = p.top_p as f64;
            let mut cum = 0.0;
            let mut keep = order.len();
            for (j, wj) in w.iter().enumerate() {
                let before = cum;
                cum += wj / z;
                if cum >= target {
                    keep = j + 1;
                    // One candidate is kept whatever the masses: only a larger set can flip.
                    let shorter = if j == 0 {
                        f64::INFINITY
                    } else {
                        target - before
                    };
                    top_p_margin = shorter.min(cum - target);
                    break;
                }
            }
            if keep == order.len() && cum < target {
                // Rounding left the total below top_p: everything is kept.
                top_p_margin = target - cum;
            }
            order.truncate(keep);
        }
    }
    order.sort_unstable();
    let probs = if order.is_empty() {
        Vec::new()
    } else {
        let max = order
            .iter()
            .map(|&i| values[i as usize] as f64)
            .fold(f64::NEG_INFINITY, f64::max);
        let t = p.temperature as f64;
        let w: Vec<f64> = order
            .iter()
            .map(|&i| {
                if t == 0.0 {
                    1.0
                } else {
                    weight(values[i as usize] as f64, max, t)
                }
            })
            .collect();
        let z: f64 = w.iter().sum();
        w.into_iter().map(|v| v / z).collect()
    };
    let cum = probs
        .iter()
        .scan(0.0, |c, &p| {
            *c += p;
            Some(*c)
        })
        .collect();
    Kept {
        ids: order,
        probs,
        cum,
        top_p_margin,
    }
}

/// `exp((v - max) / t)`, 1 for the maximum itself (also when it is `+inf`).
fn weight(v: f64, max: f64, t: f64) -> f64 {
    if v == max {
        1.0
    } else {
        ((v - max) / t).exp()
    }
}

/// The token the sampler chooses for one row and the uniform `u`; `None` when no logit is a
/// number above `-inf`.
pub fn sample(logits: &[f64], present: &[bool], p: RowParams, u: f64) -> Option<u32> {
    kept(logits, present, p).choose(u)
}
