//! References for [`crate::rope`].

/// The default inverse frequencies `theta^(-2i/d)`, `i < d/2`.
pub fn default_inv_freq(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| theta.powf(-(2.0 * i as f64) / head_dim as f64))
        .collect()
}

/// cos/sin tables `[rows, inv_freq.len()]`: entry `[p, i]` is the cos/sin of `p * inv_freq[i]`.
pub fn tables_from_inv_freq(rows: usize, inv_freq: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut cos = Vec::with_capacity(rows * inv_freq.len());
    let mut sin = Vec::with_capacity(rows * inv_freq.len());
    for p in 0..rows {
        for &f in inv_freq {
            let angle = p as f64 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// cos/sin tables `[rows, d/2]`: entry `[p, i]` is the cos/sin of `p * theta^(-2i/d)`.
pub fn tables(rows: usize, head_dim: usize, theta: f64) -> (Vec<f64>, Vec<f64>) {
    tables_from_inv_freq(rows, &default_inv_freq(head_dim, theta))
}

/// RoPE of `x[T, H, D]` at `positions[T]` with half-width tables.
pub fn rope(x: &[f64], positions: &[usize], heads: usize, cos: &[f64], sin: &[f64]) -> Vec<f64> {
    let d = x.len() / positions.len() / heads;
    let mut out = Vec::with_capacity(x.len());
    for (t, &p) in positions.iter().enumerate() {
        for h in 0..heads {
            let v = &x[(t * heads + h) * d..(t * heads + h + 1) * d];
            out.extend(crate::reference::qkv::rotate(v, cos, sin, p));
        }
    }
    out
}

/// RMSNorm over `h` then RoPE per head with full-width tables `[s, d]` (Hugging Face's
/// `x * cos + rotate_half(x) * sin`), for `x[b, s, h]`.
pub fn fused_rmsnorm_rope(
    x: &[f64],
    weight: &[f64],
    cos: &[f64],
    sin: &[f64],
    seq: usize,
    head_dim: usize,
    eps: f64,
) -> Vec<f64> {
    let h = weight.len();
    let normed = crate::reference::norm::rms_norm(x, weight, eps);
    let half = head_dim / 2;
    let mut out = vec![0.0; x.len()];
    for (r, row) in normed.chunks(h).enumerate() {
        let s = r % seq;
        for head in 0..h / head_dim {
            for i in 0..half {
                let ia = head * head_dim + i;
                let ib = ia + half;
                let (a, b) = (row[ia], row[ib]);
                out[r * h + ia] = a * cos[s * head_dim + i] - b * sin[s * head_dim + i];
                out[r * h + ib] =
                    b * cos[s * head_dim + i + half] + a * sin[s * head_dim + i + half];
            }
        }
    }
    out
}
