//! References for [`crate::attention`]: the textbook softmax(q·kᵀ·scale)·v, scores materialised,
//! in f64.

/// Attention of one sequence: `q[lq, hq, d]`, `k`/`v` `[lk, hkv, d]` (row-major), output
/// `[lq, hq, d]`. Query head `h` reads KV head `h / (hq / hkv)`. With `causal`, query `i` sees key
/// `j` iff `j <= i + lk - lq`; a query that sees no key gets zeros (only possible when `lq > lk`).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    lq: usize,
    lk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    assert_eq!(q.len(), lq * hq * d);
    assert!(k.len() >= lk * hkv * d && v.len() >= lk * hkv * d);
    let group = hq / hkv;
    let mut out = vec![0.0; lq * hq * d];
    // One query row: all heads, scores materialised.
    let row = |i: usize, o_row: &mut [f64]| {
        // Number of visible keys for this query (j < visible).
        let visible = if causal {
            (i + lk + 1).saturating_sub(lq).min(lk)
        } else {
            lk
        };
        let mut scores = vec![0.0; lk];
        for h in 0..hq {
            let hk = h / group;
            let qrow = &q[(i * hq + h) * d..][..d];
            let mut max = f64::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate().take(visible) {
                let krow = &k[(j * hkv + hk) * d..][..d];
                *s = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * scale;
                max = max.max(*s);
            }
            let mut sum = 0.0;
            for s in scores.iter_mut().take(visible) {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut o_row[h * d..][..d];
            for (j, &p) in scores.iter().enumerate().take(visible) {
                let vrow = &v[(j * hkv + hk) * d..][..d];
                for (o, &x) in o.iter_mut().zip(vrow) {
                    *o += p / sum * x;
                }
            }
        }
    };
    // Rows are independent: spread them over the host's cores (large cases take seconds).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows_per = lq.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (c, chunk) in out.chunks_mut(rows_per * hq * d).enumerate() {
            let row = &row;
            scope.spawn(move || {
                for (r, o_row) in chunk.chunks_mut(hq * d).enumerate() {
                    row(c * rows_per + r, o_row);
                }
            });
        }
    });
    out
}

/// [`attention`] over `batch` independent sequences laid out one after the other.
#[allow(clippy::too_many_arguments)]
pub fn attention_batched(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    batch: usize,
    lq: usize,
    lk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let (qs, ks) = (lq * hq * d, lk * hkv * d);
    (0..batch)
        .flat_map(|b| {
            attention(
                &q[b * qs..][..qs],
                &k[b * ks..][..ks],
                &v[b * ks..][..ks],
                lq,
                lk,
                hq,
                hkv,
                d,
                scale,
                causal,
            )
        })
        .collect()
}

/// The cache after writing `new[t, ..]` at rows `start + t` (rows past the end are dropped).
pub fn kv_cache_write(cache: &[f64], new: &[f64], row: usize, start: usize) -> Vec<f64> {
    let mut out = cache.to_vec();
    let rows = cache.len() / row;
    for (t, src) in new.chunks(row).enumerate() {
        if start + t < rows {
            out[(start + t) * row..][..row].copy_from_slice(src);
        }
    }
    out
}
