//! References for [`crate::norm`].

/// `1 / sqrt(mean(row²) + eps)`: the factor RMSNorm scales a row by before its weight.
pub fn inv_rms(row: &[f64], eps: f64) -> f64 {
    1.0 / (row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64 + eps).sqrt()
}

/// RMSNorm of each row of `x` (`rows x n`, row-major).
pub fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|row| {
            let inv = inv_rms(row, eps);
            row.iter()
                .zip(w)
                .map(move |(v, w)| v * inv * w)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `(rms_norm(x + r), x + r)`.
pub fn rms_norm_residual(x: &[f64], r: &[f64], w: &[f64], eps: f64) -> (Vec<f64>, Vec<f64>) {
    let sum: Vec<f64> = x.iter().zip(r).map(|(a, b)| a + b).collect();
    (rms_norm(&sum, w, eps), sum)
}
