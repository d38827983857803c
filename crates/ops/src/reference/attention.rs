//! Reference for [`crate::attention`]: materialises the scores in f64.

/// `q[lq, hq, d]`, `k`/`v` `[lk, hkv, d]` (only the first `kv_len` rows are used).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (lq, hq, hkv, d): (usize, usize, usize, usize),
    kv_len: usize,
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let group = hq / hkv;
    let mut out = vec![0.0; lq * hq * d];
    for t in 0..lq {
        for h in 0..hq {
            let kvh = h / group;
            let qrow = &q[(t * hq + h) * d..(t * hq + h + 1) * d];
            let visible = |j: usize| !causal || j + lq <= t + kv_len;
            let scores: Vec<f64> = (0..kv_len)
                .map(|j| {
                    if !visible(j) {
                        return f64::NEG_INFINITY;
                    }
                    let krow = &k[(j * hkv + kvh) * d..(j * hkv + kvh + 1) * d];
                    qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let sum: f64 = w.iter().sum();
            for (j, wj) in w.iter().enumerate() {
                if *wj == 0.0 {
                    continue;
                }
                let vrow = &v[(j * hkv + kvh) * d..(j * hkv + kvh + 1) * d];
                for dd in 0..d {
                    out[(t * hq + h) * d + dd] += wj / sum * vrow[dd];
                }
            }
        }
    }
    out
}
