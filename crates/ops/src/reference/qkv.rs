//! Reference for [`crate::qkv`].

/// cos/sin tables `[rows, d/2]` in f64: `theta^(-2i/d) * p`.
pub fn rope_tables(rows: usize, head_dim: usize, theta: f64) -> (Vec<f64>, Vec<f64>) {
    crate::reference::rope::tables(rows, head_dim, theta)
}

/// Rotate-half RoPE of one head vector at table row `p`.
pub fn rotate(x: &[f64], cos: &[f64], sin: &[f64], p: usize) -> Vec<f64> {
    let half = x.len() / 2;
    let mut out = vec![0.0; x.len()];
    for i in 0..half {
        let (c, s) = (cos[p * half + i], sin[p * half + i]);
        out[i] = x[i] * c - x[i + half] * s;
        out[i + half] = x[i + half] * c + x[i] * s;
    }
    out
}

/// The per-head RMSNorm of [`crate::qkv::QkNorm`]: weights `[d]` of the q and the k heads.
#[derive(Debug, Clone, Copy)]
pub struct HeadNorm<'a> {
    pub q_weight: &'a [f64],
    pub k_weight: &'a [f64],
    pub eps: f64,
}

/// `x / sqrt(mean(x²) + eps) * w` over one head.
pub fn head_rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    crate::reference::norm::rms_norm(x, w, eps)
}

/// `(q [T, Hq, D], k rows, v rows)` of [`crate::qkv::qkv_rope_cache_into`] for tokens at
/// positions `start..start + T`, q and k heads normalised first when `norm` is given; k and v
/// are returned as `[T, Hkv, D]` (the rows written).
pub fn qkv_rope(
    qkv: &[f64],
    tokens: usize,
    (hq, hkv, d): (usize, usize, usize),
    cos: &[f64],
    sin: &[f64],
    start: usize,
    norm: Option<HeadNorm<'_>>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let heads = hq + 2 * hkv;
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    let normed = |x: &[f64], is_q: bool| match &norm {
        Some(n) => head_rms_norm(x, if is_q { n.q_weight } else { n.k_weight }, n.eps),
        None => x.to_vec(),
    };
    for t in 0..tokens {
        for h in 0..heads {
            let x = &qkv[(t * heads + h) * d..(t * heads + h + 1) * d];
            if h < hq {
                q.extend(rotate(&normed(x, true), cos, sin, start + t));
            } else if h < hq + hkv {
                k.extend(rotate(&normed(x, false), cos, sin, start + t));
            } else {
                v.extend_from_slice(x);
            }
        }
    }
    (q, k, v)
}
