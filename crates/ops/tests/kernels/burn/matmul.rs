//! `linear` (with its bias and residual epilogues) and the fused gated MLP on Burn tensors.

use super::*;
use ops::matmul::Activation;

/// As in the matmul suite: f32 accumulation over K in an order Burn's matmul does not share,
/// then one rounding to the dtype.
fn matmul_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        d => tolerance(d),
    }
}

fn linear_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(41);
    // Leading dims of x, K, N: decode-size rows (the GEMV) and prefill-size ones (the GEMM).
    let shapes = [
        (vec![5usize], 72usize, 40usize),
        (vec![37], 96, 48),
        (vec![3, 7], 64, 24),
    ];
    for dtype in float_dtypes(client) {
        for (lead, k, n) in &shapes {
            let (k, n) = (*k, *n);
            let m: usize = lead.iter().product();
            let x_shape = [lead.clone(), vec![k]].concat();
            let y_shape = [lead.clone(), vec![n]].concat();
            let x = random(&mut rng, m * k, 1.0);
            let w = random(&mut rng, n * k, 1.0);
            let bias = random(&mut rng, n, 1.0);
            let residual = random(&mut rng, m * n, 1.0);
            for (with_bias, with_residual) in
                [(false, false), (true, false), (true, true), (false, true)]
            {
                let (xt, xr) = input::<R>(&x, &x_shape, dtype);
                // The weight as Burn's `nn::Linear` holds it, `[K, N]`, passed transposed: a
                // strided `[N, K]` view.
                let (wt, wr) = input_strided::<R>(&w, &[n, k], dtype, (0, 1));
                let (bt, br) = input::<R>(&bias, &[n], dtype);
                let (rt, rr) = input::<R>(&residual, &y_shape, dtype);
                let ours =
                    ops::burn::linear(xt, wt, with_bias.then_some(bt), with_residual.then_some(rt))
                        .expect("linear on burn");
                let mut want = matmul_wt::<R>(xr, wr);
                if with_bias {
                    want = B::<R>::float_add(want, row_vector::<R>(br, y_shape.len()));
                }
                if with_residual {
                    want = B::<R>::float_add(want, rr);
                }
                check(
                    &format!(
                        "burn linear {dtype} x{x_shape:?} n{n} bias={with_bias} residual={with_residual}"
                    ),
                    ours,
                    want,
                    dtype,
                    matmul_tol(dtype),
                );
            }
        }
    }
}

fn gated_mlp_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(42);
    // Rows, H, I: the GEMV and the GEMM.
    let shapes = [(3usize, 64usize, 40usize), (19, 96, 24)];
    for dtype in float_dtypes(client) {
        for &(m, h, i) in &shapes {
            for act in [Activation::Silu, Activation::Gelu] {
                let x = random(&mut rng, m * h, 1.0);
                let gate = random(&mut rng, i * h, 1.0);
                let up = random(&mut rng, i * h, 1.0);
                let (xt, xr) = input_strided::<R>(&x, &[m, h], dtype, (0, 1));
                let (gt, gr) = input::<R>(&gate, &[i, h], dtype);
                let (ut, ur) = input::<R>(&up, &[i, h], dtype);
                let ours = ops::burn::gated_mlp(xt, gt, ut, act).expect("gated_mlp on burn");

                let g = matmul_wt::<R>(xr.clone(), gr);
                let u = matmul_wt::<R>(xr, ur);
                let activated = match act {
                    // g * sigmoid(g) = g / (1 + exp(-g)).
                    Activation::Silu => B::<R>::float_div(
                        g.clone(),
                        B::<R>::float_add_scalar(
                            B::<R>::float_exp(B::<R>::float_neg(g)),
                            Scalar::Float(1.0),
                        ),
                    ),
                    // 0.5 g (1 + erf(g / √2)).
                    Activation::Gelu => B::<R>::float_mul(
                        B::<R>::float_mul_scalar(g.clone(), Scalar::Float(0.5)),
                        B::<R>::float_add_scalar(
                            B::<R>::float_erf(B::<R>::float_mul_scalar(
                                g,
                                Scalar::Float(std::f64::consts::FRAC_1_SQRT_2),
                            )),
                            Scalar::Float(1.0),
                        ),
                    ),
                };
                check(
                    &format!("burn gated_mlp {dtype} {m}x{h} -> {i} {act:?}"),
                    ours,
                    B::<R>::float_mul(activated, u),
                    dtype,
                    // Two roundings: the products, then the gated result.
                    2.0 * matmul_tol(dtype),
                );
            }
        }
    }
}

#[test]
fn linear_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(linear_case);
}

#[test]
fn gated_mlp_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(gated_mlp_case);
}
