//! Reference for [`crate::qkv`].

/// cos/sin tables `[rows, d/2]` in f64: `theta^(-2i/d) * p`.
pub fn rope_tables(rows: usize, head_dim: usize, theta: f64) -> (Vec<f64>, Vec<f64>) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(rows * half);
    let mut sin = Vec::with_capacity(rows * half);
    for p in 0..rows {
        for i in 0..half {
            let inv_freq = theta.powf(-(2.0 * i as f64) / head_dim as f64);
            let angle = p as f64 * inv_freq;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
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

/// `(q [T, Hq, D], k rows, v rows)` of [`crate::qkv::qkv_rope_cache_into`] for tokens at
/// positions `start..start + T`; k and v are returned as `[T, Hkv, D]` (the rows written).
pub fn qkv_rope(
    qkv: &[f64],
    tokens: usize,
    (hq, hkv, d): (usize, usize, usize),
    cos: &[f64],
    sin: &[f64],
    start: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let heads = hq + 2 * hkv;
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..tokens {
        for h in 0..heads {
            let x = &qkv[(t * heads + h) * d..(t * heads + h + 1) * d];
            if h < hq {
                q.extend(rotate(x, cos, sin, start + t));
            } else if h < hq + hkv {
                k.extend(rotate(x, cos, sin, start + t));
            } else {
                v.extend_from_slice(x);
            }
        }
    }
    (q, k, v)
}
