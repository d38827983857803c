//! The Burn modules on every runtime present: the dense `Linear` against Burn's own arithmetic
//! (`x · wᵀ + b` as a broadcast product summed with Burn ops, in f32 on the same rounded
//! values), the quantized and sparse modules against the f64 references of the quant and sparse
//! crates with their tolerances. Every case runs in each float dtype the runtime has
//! (`testkit::float_dtypes`: bf16 on CUDA), on a non-contiguous input (a transposed and a sliced
//! view) of rank 3; records round-trip for the dense module; bad inputs are errors.

use burn_core::module::Module;
use burn_core::store::ModuleRecord;
use burn_tensor::{FloatDType, Tensor, TensorData};
use cubecl::prelude::*;
use cubellm_burn::{
    tensor_from_data, BurnRuntime, Fp8Linear, Linear, SparseLinear, W4A16Linear, W8A8Linear,
};
use ops::DType;
use quant::format::QuantFormat;
use quant::reference as qref;
use testkit::{
    assert_close, assert_err, float_dtypes, on_each_runtime, random, rng, round_to, tolerance,
};

fn burn_float(dtype: DType) -> FloatDType {
    match dtype {
        DType::F32 => FloatDType::F32,
        DType::F16 => FloatDType::F16,
        DType::BF16 => FloatDType::BF16,
        other => panic!("{other} is not a float dtype"),
    }
}

/// `values` rounded to `dtype`: a tensor of `dtype` (the module's input), one of f32 (Burn's
/// reference arithmetic), and the rounded values in f64 (the host references).
fn input<R: BurnRuntime, const D: usize>(
    values: &[f32],
    shape: [usize; D],
    dtype: DType,
) -> (Tensor<D>, Tensor<D>, Vec<f64>) {
    let host = round_to(values, dtype);
    let rounded: Vec<f32> = host.iter().map(|&v| v as f32).collect();
    let reference: Tensor<D> =
        tensor_from_data::<R, D>(TensorData::new(rounded, shape), &Default::default()).unwrap();
    (reference.clone().cast(burn_float(dtype)), reference, host)
}

/// The input `x [2, M, K]` twice as a non-contiguous view: stored `[2, K, M]` and swapped, and
/// stored `[2, M, K + 5]` and sliced to the first K columns. The f32 reference and the host
/// values are of the logical (row-major `[2, M, K]`) tensor.
fn strided_inputs<R: BurnRuntime>(
    values: &[f32],
    m: usize,
    k: usize,
    dtype: DType,
) -> Vec<(&'static str, Tensor<3>, Tensor<3>, Vec<f64>)> {
    let (_, reference, host) = input::<R, 3>(values, [2, m, k], dtype);
    let at = |b: usize, i: usize, j: usize| values[(b * m + i) * k + j];
    let mut stored = Vec::with_capacity(2 * m * k);
    for b in 0..2 {
        for j in 0..k {
            for i in 0..m {
                stored.push(at(b, i, j));
            }
        }
    }
    let (t, _, _) = input::<R, 3>(&stored, [2, k, m], dtype);
    let transposed = t.swap_dims(1, 2);
    let mut wide = Vec::with_capacity(2 * m * (k + 5));
    for b in 0..2 {
        for i in 0..m {
            for j in 0..k + 5 {
                wide.push(if j < k { at(b, i, j) } else { 7.0 });
            }
        }
    }
    let (t, _, _) = input::<R, 3>(&wide, [2, m, k + 5], dtype);
    let sliced = t.slice([0..2, 0..m, 0..k]);
    vec![
        ("transposed", transposed, reference.clone(), host.clone()),
        ("sliced", sliced, reference, host),
    ]
}

fn read<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.cast(FloatDType::F32)
        .into_data()
        .iter::<f32>()
        .map(|v| v as f64)
        .collect()
}

/// Burn's arithmetic: `x[.., K] · w[N, K]ᵀ + b` as a broadcast product summed over K (not
/// `matmul`: on CUDA Burn runs f32 products on TF32 tensor cores, too coarse for a reference).
fn burn_linear(x: Tensor<3>, w: Tensor<2>, b: Option<Tensor<1>>) -> Tensor<3> {
    let [a, m, k] = x.dims();
    let [n, _] = w.dims();
    let products = x.reshape([a * m, 1, k]) * w.reshape([1, n, k]);
    let mut y = products.sum_dim(2).reshape([a, m, n]);
    if let Some(b) = b {
        y = y + b.reshape([1, 1, n]);
    }
    y
}

fn matmul_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        d => tolerance(d),
    }
}

fn dense_case<R: BurnRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(7);
    // (M, K, N): the decode GEMV (2x3 rows) and the GEMM (2x20 rows).
    for dtype in float_dtypes(client) {
        for (m, k, n) in [(3usize, 72usize, 40usize), (20, 96, 48)] {
            let x = random(&mut rng, 2 * m * k, 1.0);
            let w = random(&mut rng, n * k, 1.0);
            let bias = random(&mut rng, n, 1.0);
            let (wt, wr, _) = input::<R, 2>(&w, [n, k], dtype);
            let (bt, br, _) = input::<R, 1>(&bias, [n], dtype);
            for with_bias in [false, true] {
                let layer =
                    Linear::<R>::new(wt.clone(), with_bias.then(|| bt.clone())).expect("new");
                assert_eq!(layer.shape(), [n, k]);
                for (how, xt, xr, _) in strided_inputs::<R>(&x, m, k, dtype) {
                    let got = layer.forward(xt).expect("forward");
                    assert_eq!(got.dims(), [2, m, n]);
                    assert_eq!(got.dtype(), burn_float(dtype).into());
                    let want = burn_linear(xr, wr.clone(), with_bias.then(|| br.clone()));
                    assert_close(
                        &format!("Linear {dtype} {m}x{k}->{n} bias={with_bias} x {how}"),
                        &read(got),
                        &read(want),
                        matmul_tol(dtype),
                    );
                }
            }
            // Burn's nn::Linear layout, [K, N], and the residual epilogue.
            let wkn = wr.clone().transpose().cast(burn_float(dtype));
            let layer = Linear::<R>::from_in_out(wkn, Some(bt.clone())).expect("from_in_out");
            let (xt, xr, _) = input::<R, 3>(&x, [2, m, k], dtype);
            let res = random(&mut rng, 2 * m * n, 1.0);
            let (rt, rr, _) = input::<R, 3>(&res, [2, m, n], dtype);
            let got = layer.forward_residual(xt, rt).expect("forward_residual");
            let want = burn_linear(xr, wr.clone(), Some(br.clone())) + rr;
            assert_close(
                &format!("Linear::from_in_out {dtype} {m}x{k}->{n} + residual"),
                &read(got),
                &read(want),
                matmul_tol(dtype),
            );
        }
    }
}

fn record_case<R: BurnRuntime>(_client: &ComputeClient<R>) {
    let mut rng = rng(8);
    let (m, k, n) = (4, 32, 24);
    let (w, _, _) = input::<R, 2>(&random(&mut rng, n * k, 1.0), [n, k], DType::F32);
    let (b, _, _) = input::<R, 1>(&random(&mut rng, n, 1.0), [n], DType::F32);
    let (x, _, _) = input::<R, 3>(&random(&mut rng, 2 * m * k, 1.0), [2, m, k], DType::F32);
    let layer = Linear::<R>::new(w, Some(b)).unwrap();
    let want = read(layer.forward(x.clone()).unwrap());
    let bytes = layer.into_record().into_bytes().expect("save");
    // A layer of other weights takes the recorded ones.
    let (w0, _, _) = input::<R, 2>(&vec![0.0; n * k], [n, k], DType::F32);
    let (b0, _, _) = input::<R, 1>(&vec![0.0; n], [n], DType::F32);
    let other = Linear::<R>::new(w0, Some(b0)).unwrap();
    let record = ModuleRecord::from_bytes(bytes).expect("read");
    let loaded = other.try_load_record(record).expect("load");
    assert_eq!(read(loaded.forward(x).unwrap()), want, "loaded Linear");
}

/// Relative tolerance of a dequantized 8-bit output (as in the quant crate's tests).
fn dequant_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::BF16 => 4e-3,
        _ => 1e-3,
    }
}

fn rows_close(what: &str, got: &[f64], want: &[f64], n: usize, tol: f64) {
    for (r, (g, w)) in got.chunks(n).zip(want.chunks(n)).enumerate() {
        assert_close(&format!("{what} row {r}"), g, w, tol);
    }
}

fn quantized_case<R: BurnRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(9);
    for dtype in float_dtypes(client) {
        // 2x3 rows (the decode paths) and 2x12 (prefill).
        for (m, k, n) in [(3usize, 64usize, 40usize), (12, 128, 24)] {
            let rows = 2 * m;
            let x = random(&mut rng, rows * k, 1.0);
            let w = random(&mut rng, n * k, 0.5);
            let bias = random(&mut rng, n, 1.0);
            let (wt, _, wh) = input::<R, 2>(&w, [n, k], dtype);
            let (bt, _, biash) = input::<R, 1>(&bias, [n], dtype);
            let w_rounded: Vec<f32> = wh.iter().map(|&v| v as f32).collect();
            let dense = Linear::<R>::new(wt.clone(), Some(bt.clone())).unwrap();

            for fmt in [QuantFormat::Int8, QuantFormat::Fp8E4M3] {
                let (layer_fwd, name): (Box<dyn Fn(Tensor<3>) -> Tensor<3>>, _) = match fmt {
                    QuantFormat::Int8 => {
                        let l = W8A8Linear::from_linear(&dense).expect("W8A8Linear");
                        assert_eq!(l.shape(), [n, k]);
                        (
                            Box::new(move |x| l.forward(x).expect("forward")),
                            "W8A8Linear",
                        )
                    }
                    _ => {
                        let l = Fp8Linear::from_linear(&dense).expect("Fp8Linear");
                        (
                            Box::new(move |x| l.forward(x).expect("forward")),
                            "Fp8Linear",
                        )
                    }
                };
                let qw = quant::host::quantize_weight_8bit(&w_rounded, n, k, fmt).unwrap();
                for (how, xt, _, xh) in strided_inputs::<R>(&x, m, k, dtype) {
                    let got = layer_fwd(xt);
                    assert_eq!(got.dims(), [2, m, n]);
                    let (cx, sx) = qref::quantize_rows(&xh, rows, k, fmt);
                    let acc = qref::gemm_nt_codes(&cx, &qw.q.dense(), rows, n, k, fmt);
                    let want = qref::dequant_epilogue(&acc, rows, n, &sx, &qw.scales, Some(&biash));
                    rows_close(
                        &format!("{name} {dtype} {rows}x{k}->{n} x {how}"),
                        &read(got),
                        &want,
                        n,
                        dequant_tolerance(dtype),
                    );
                }
            }

            for group in [None, Some(32)] {
                let l = W4A16Linear::from_linear(&dense, group).expect("W4A16Linear");
                let qw = quant::host::quantize_weight_int4(&w_rounded, n, k, group).unwrap();
                for (how, xt, _, xh) in strided_inputs::<R>(&x, m, k, dtype) {
                    let got = l.forward(xt).expect("forward");
                    let want = qref::w4a16(&xh, rows, &qw, Some(&biash));
                    assert_close(
                        &format!("W4A16Linear {dtype} group {group:?} {rows}x{k}->{n} x {how}"),
                        &read(got),
                        &want,
                        2.0 * tolerance(dtype),
                    );
                }
            }
        }
    }
}

fn sparse_case<R: BurnRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(10);
    let (block, n, k) = (16usize, 48usize, 64usize);
    for dtype in float_dtypes(client) {
        for m in [3usize, 20] {
            let rows = 2 * m;
            let x = random(&mut rng, rows * k, 1.0);
            // A weight with every other block zero.
            let mut w = random(&mut rng, n * k, 1.0);
            for r in 0..n {
                for c in 0..k {
                    if (r / block + c / block) % 2 == 1 {
                        w[r * k + c] = 0.0;
                    }
                }
            }
            let bias = random(&mut rng, n, 1.0);
            let (wt, _, wh) = input::<R, 2>(&w, [n, k], dtype);
            let (bt, _, biash) = input::<R, 1>(&bias, [n], dtype);
            for sparsity in [0.0, 0.75] {
                let l =
                    SparseLinear::<R>::from_dense(wt.clone(), Some(bt.clone()), block, sparsity)
                        .expect("SparseLinear");
                // The dense weight the layer holds (every non-zero block at sparsity 0).
                let kept: Vec<f64> = l
                    .layer()
                    .weight
                    .to_dense(client)
                    .unwrap()
                    .into_iter()
                    .map(f64::from)
                    .collect();
                if sparsity == 0.0 {
                    assert_eq!(kept, wh, "sparsity 0 keeps every non-zero block");
                }
                for (how, xt, _, xh) in strided_inputs::<R>(&x, m, k, dtype) {
                    let got = l.forward(xt).expect("forward");
                    let want = sparse::reference::linear(&xh, &kept, Some(&biash), rows, k, n);
                    assert_close(
                        &format!(
                            "SparseLinear {dtype} sparsity {sparsity} {rows}x{k}->{n} x {how}"
                        ),
                        &read(got),
                        &want,
                        matmul_tol(dtype),
                    );
                }
            }
        }
    }
}

fn errors_case<R: BurnRuntime>(_client: &ComputeClient<R>) {
    let (n, k) = (16, 32);
    let (w, _, _) = input::<R, 2>(&vec![0.5; n * k], [n, k], DType::F32);
    let (b, _, _) = input::<R, 1>(&vec![0.5; n + 1], [n + 1], DType::F32);
    let (x, _, _) = input::<R, 3>(&vec![0.5; 2 * 3 * (k + 1)], [2, 3, k + 1], DType::F32);
    let (xh, _, _) = input::<R, 3>(&vec![0.5; 2 * 3 * k], [2, 3, k], DType::F16);

    assert_err(
        "Linear bias length",
        Linear::<R>::new(w.clone(), Some(b.clone())),
        "shape",
    );
    let dense = Linear::<R>::new(w.clone(), None).unwrap();
    assert_err("Linear in_features", dense.forward(x.clone()), "shape");
    assert_err("Linear x dtype", dense.forward(xh.clone()), "dtype");

    assert_err(
        "W8A8Linear bias length",
        W8A8Linear::<R>::from_dense(w.clone(), Some(b.clone())),
        "shape",
    );
    let l = W8A8Linear::<R>::from_linear(&dense).unwrap();
    assert_err("W8A8Linear in_features", l.forward(x.clone()), "shape");
    let l = Fp8Linear::<R>::from_linear(&dense).unwrap();
    assert_err("Fp8Linear in_features", l.forward(x.clone()), "shape");
    let l = W4A16Linear::<R>::from_linear(&dense, Some(32)).unwrap();
    assert_err("W4A16Linear in_features", l.forward(x.clone()), "shape");
    assert_err("W4A16Linear x dtype", l.forward(xh), "dtype");
    assert_err(
        "W4A16Linear group",
        W4A16Linear::<R>::from_linear(&dense, Some(12)),
        "argument",
    );
    assert_err(
        "SparseLinear block",
        SparseLinear::<R>::from_linear(&dense, 12, 0.0),
        "shape",
    );
    let l = SparseLinear::<R>::from_linear(&dense, 16, 0.0).unwrap();
    assert_err("SparseLinear in_features", l.forward(x), "shape");
}

#[test]
fn dense_linear_matches_burn_arithmetic() {
    on_each_runtime!(dense_case);
}

#[test]
fn dense_linear_records_and_loads() {
    on_each_runtime!(record_case);
}

#[test]
fn quantized_linears_match_the_quant_references() {
    on_each_runtime!(quantized_case);
}

#[test]
fn sparse_linear_matches_the_sparse_reference() {
    on_each_runtime!(sparse_case);
}

#[test]
fn bad_inputs_are_errors() {
    on_each_runtime!(errors_case);
}
