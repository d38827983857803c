//! References for [`crate::norm`].

/// RMSNorm of each row of `x` (`rows x n`, row-major).
pub fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let n = w.len();
    x.chunks(n)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + eps).sqrt();
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
