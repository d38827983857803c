//! References for the element-wise ops, embedding, argmax and softmax.

/// `a + b` with `b` either the same length or a row broadcast over `a`'s rows.
pub fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .enumerate()
        .map(|(i, v)| v + b[i % b.len()])
        .collect()
}

pub fn swiglu(gate: &[f64], up: &[f64]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

/// Rows of `table[V, H]` picked by `ids`, clamping out-of-range ids to `V - 1`.
pub fn embedding(table: &[f64], hidden: usize, ids: &[i64]) -> Vec<f64> {
    let vocab = table.len() / hidden;
    ids.iter()
        .flat_map(|&id| {
            let r = if id < 0 || id as usize >= vocab {
                vocab - 1
            } else {
                id as usize
            };
            table[r * hidden..(r + 1) * hidden].to_vec()
        })
        .collect()
}

/// First index of the maximum of each row (NaN skipped, 0 for a row of only NaN).
pub fn argmax(x: &[f64], n: usize) -> Vec<u32> {
    x.chunks(n)
        .map(|row| {
            let mut best: Option<(usize, f64)> = None;
            for (i, &v) in row.iter().enumerate() {
                if v.is_nan() {
                    continue;
                }
                if best.is_none_or(|(_, b)| v > b) {
                    best = Some((i, v));
                }
            }
            best.map_or(0, |(i, _)| i as u32)
        })
        .collect()
}

pub fn softmax(x: &[f64], n: usize) -> Vec<f64> {
    x.chunks(n)
        .flat_map(|row| {
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}
