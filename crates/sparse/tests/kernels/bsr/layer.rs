//! `SparseLinear` through the `Linear` capability.

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, LinearWorkspace};
use sparse::{reference, SparseLinear};
use testkit::*;

/// The layer through the `Linear` capability: bias, residual and gated epilogues (the last two
/// run after the kernel, through the workspace or a temporary), against the reference.
fn layer_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(77);
    let shape = [128, 96];
    let dense = random(&mut rng, 128 * 96, 1.0);
    let bias = random(&mut rng, 128, 1.0);
    for dtype in float_dtypes(client) {
        let layer = SparseLinear::prune(client, &dense, shape, 32, 0.5, dtype).unwrap();
        assert_eq!(layer.weight.nnz_blocks(), 6);
        assert_eq!((layer.in_features(), layer.out_rows()), (96, 128));
        let pruned: Vec<f64> = layer
            .weight
            .to_dense(client)
            .unwrap()
            .into_iter()
            .map(|v| v as f64)
            .collect();
        let (x, xh) = upload(client, &random(&mut rng, 9 * 96, 1.0), &[9, 96], dtype);
        let (b, bh) = upload(client, &bias, &[128], dtype);
        let want = reference::linear(&xh, &pruned, Some(&bh), 9, 96, 128);
        let with_bias = Epilogue::NONE.bias(Some(&b));
        let y = layer.forward(client, &x, with_bias).unwrap();
        assert_close(
            &format!("SparseLinear::forward {dtype}"),
            &y.to_f64_vec(client).unwrap(),
            &want,
            tolerance(dtype),
        );
        let ws = LinearWorkspace::new(client, 9, 96, 128, dtype);
        let (r, rh) = upload(client, &random(&mut rng, 9 * 128, 1.0), &[9, 128], dtype);
        let out = poisoned(client, &[9, 128], dtype);
        let epilogue = with_bias.residual(&r);
        layer
            .forward_into(client, &x, epilogue, &out, Some(&ws))
            .unwrap();
        // The product is rounded to the dtype before the residual is added.
        let rounded = round_to(&want.iter().map(|&v| v as f32).collect::<Vec<_>>(), dtype);
        let want_res: Vec<f64> = rounded.iter().zip(&rh).map(|(p, r)| p + r).collect();
        assert_close(
            &format!("SparseLinear::forward_into + residual {dtype}"),
            &out.to_f64_vec(client).unwrap(),
            &want_res,
            tolerance(dtype),
        );
        // Gated: the 128 rows are 64 gate rows then 64 up rows.
        let out = poisoned(client, &[9, 64], dtype);
        let gated = with_bias.gated(ops::matmul::Activation::Silu);
        layer
            .forward_into(client, &x, gated, &out, Some(&ws))
            .unwrap();
        let want_gated: Vec<f64> = (0..9 * 64)
            .map(|i| {
                let (row, col) = (i / 64, i % 64);
                let g = rounded[row * 128 + col];
                let u = rounded[row * 128 + 64 + col];
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        assert_close(
            &format!("SparseLinear gated {dtype}"),
            &out.to_f64_vec(client).unwrap(),
            &want_gated,
            tolerance(dtype),
        );
        // A dense weight kept whole is the dense layer.
        let full = SparseLinear::from_dense(client, &dense, shape, 32, dtype).unwrap();
        assert_eq!(full.weight.density(), 1.0);
        let want = reference::linear(&xh, &round_to(&dense, dtype), None, 9, 96, 128);
        assert_close(
            &format!("SparseLinear dense {dtype}"),
            &full
                .forward(client, &x, Epilogue::NONE)
                .unwrap()
                .to_f64_vec(client)
                .unwrap(),
            &want,
            tolerance(dtype),
        );
    }
}

#[test]
fn sparse_linear_layer() {
    on_each_runtime!(layer_case);
}
