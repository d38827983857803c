//! CPU f64 references for the tests: the dense linear layer the BSR matmul must equal.

/// `y[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n])` for row-major `x[M, K]` and `w[N, K]`.
pub fn linear(
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f64> {
    assert_eq!(x.len(), m * k, "reference::linear: x");
    assert_eq!(w.len(), n * k, "reference::linear: w");
    let mut y = vec![0f64; m * n];
    for i in 0..m {
        let xr = &x[i * k..(i + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            let dot: f64 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
            y[i * n + j] = dot + bias.map_or(0.0, |b| b[j]);
        }
    }
    y
}

/// The dense `[N, K]` matrix of raw BSR arrays (f64), independent of [`crate::Bsr::to_dense`].
pub fn bsr_to_dense(
    crow: &[i32],
    col: &[i32],
    values: &[f64],
    shape: [usize; 2],
    block: usize,
) -> Vec<f64> {
    let mut dense = vec![0f64; shape[0] * shape[1]];
    for br in 0..crow.len() - 1 {
        for idx in crow[br] as usize..crow[br + 1] as usize {
            let bc = col[idx] as usize;
            for i in 0..block {
                for j in 0..block {
                    dense[(br * block + i) * shape[1] + bc * block + j] =
                        values[(idx * block + i) * block + j];
                }
            }
        }
    }
    dense
}
