//! References for [`crate::matmul`].

/// `x[m, k] · w[n, k]ᵀ (+ bias[n]) (+ residual[m, n])`.
pub fn linear(
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    residual: Option<&[f64]>,
    (m, n, k): (usize, usize, usize),
) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s: f64 = (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum();
            if let Some(b) = bias {
                s += b[j];
            }
            if let Some(r) = residual {
                s += r[i * n + j];
            }
            y[i * n + j] = s;
        }
    }
    y
}

pub fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

/// PyTorch's exact GELU, `0.5 g (1 + erf(g / √2))`.
pub fn gelu(g: f64) -> f64 {
    0.5 * g * (1.0 + erf(g / std::f64::consts::SQRT_2))
}

/// erf by its Taylor series / continued fraction (|error| < 1e-14), to avoid a dependency.
pub fn erf(x: f64) -> f64 {
    if x.abs() < 3.0 {
        // Maclaurin series: 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)).
        let mut sum = 0.0f64;
        let mut term = x;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs().max(1e-300) || n < 3.0 {
            sum += term / (2.0 * n + 1.0);
            n += 1.0;
            term *= -x * x / n;
            if n > 200.0 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // Asymptotic tail: erfc(x) ≈ exp(-x²)/(x√π) (1 - 1/(2x²) + 3/(4x⁴) - ...).
        let z = x.abs();
        let mut s = 1.0;
        let mut t = 1.0;
        for i in 1..12 {
            t *= -((2 * i - 1) as f64) / (2.0 * z * z);
            s += t;
        }
        let erfc = (-z * z).exp() / (z * std::f64::consts::PI.sqrt()) * s;
        x.signum() * (1.0 - erfc)
    }
}

/// `act(x·gateᵀ) * (x·upᵀ)`.
pub fn gated_mlp(
    x: &[f64],
    gate: &[f64],
    up: &[f64],
    gelu_act: bool,
    (m, i, k): (usize, usize, usize),
) -> Vec<f64> {
    let g = linear(x, gate, None, None, (m, i, k));
    let u = linear(x, up, None, None, (m, i, k));
    g.iter()
        .zip(&u)
        .map(|(&g, &u)| if gelu_act { gelu(g) } else { silu(g) } * u)
        .collect()
}
