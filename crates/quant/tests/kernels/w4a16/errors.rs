//! Every validation error of the W4A16 entry points and the layer: one clear error, never a
//! launch on bad operands.

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear};
use ops::{caps, DType, DeviceTensor};
use quant::host;
use quant::w4a16::{w4a16_linear_into, w4a16_linear_into_with};
use quant::{W4A16Linear, W4a16Kernel};
use testkit::*;

use super::upload_weight;

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let (m, k, n) = (2usize, 128usize, 16usize);
    let f = DType::F32;
    let mut rng = rng(500);
    let w = random(&mut rng, n * k, 1.0);
    let qw = host::quantize_weight_int4(&w, n, k, Some(64)).unwrap();
    let (q, s) = upload_weight(client, &qw);
    let s_chan = DeviceTensor::from_f32(client, &vec![1.0; n], &[n], f).unwrap();
    let x = DeviceTensor::from_f32(client, &random(&mut rng, m * k, 1.0), &[m, k], f).unwrap();
    let out = poisoned(client, &[m, n], f);
    let g = Some(64);
    let run = |x: &DeviceTensor<R>,
               q: &DeviceTensor<R>,
               s: &DeviceTensor<R>,
               g: Option<usize>,
               b: Option<&DeviceTensor<R>>,
               out: &DeviceTensor<R>| w4a16_linear_into(client, x, q, s, g, b, out);

    assert!(run(&x, &q, &s, g, None, &out).is_ok());
    // K not a multiple of 8, or of the group; a group that is not a multiple of 8.
    let x12 = DeviceTensor::from_f32(client, &[0.0; 2 * 12], &[2, 12], f).unwrap();
    let q12 = DeviceTensor::from_slice(client, &vec![0i32; 2 * n], &[2, n]).unwrap();
    assert_err("K % 8", run(&x12, &q12, &s_chan, None, None, &out), "shape");
    let x136 = DeviceTensor::from_f32(client, &vec![0.0; 136], &[1, 136], f).unwrap();
    let q136 = DeviceTensor::from_slice(client, &vec![0i32; 17 * n], &[17, n]).unwrap();
    let out1 = poisoned(client, &[1, n], f);
    assert_err("K % g", run(&x136, &q136, &s, g, None, &out1), "shape");
    assert_err("g % 8", run(&x, &q, &s, Some(12), None, &out), "argument");
    assert_err("g = 0", run(&x, &q, &s, Some(0), None, &out), "argument");
    // qweight: dtype, K mismatch, rank.
    let qf = DeviceTensor::from_f32(client, &vec![0.0; k / 8 * n], &[k / 8, n], f).unwrap();
    assert_err("qweight dtype", run(&x, &qf, &s, g, None, &out), "dtype");
    let q_short = DeviceTensor::from_slice(client, &vec![0i32; 8 * n], &[8, n]).unwrap();
    assert_err("qweight K", run(&x, &q_short, &s, g, None, &out), "shape");
    let q_flat = q.reshape(&[k / 8 * n]).unwrap();
    assert_err("qweight rank", run(&x, &q_flat, &s, g, None, &out), "shape");
    // scales: dtype, per-channel vs grouped shapes.
    let s16 = DeviceTensor::from_f32(client, &vec![1.0; 2 * n], &[2, n], DType::F16);
    if let Ok(s16) = s16 {
        assert_err("scales dtype", run(&x, &q, &s16, g, None, &out), "dtype");
    }
    assert_err(
        "grouped scales",
        run(&x, &q, &s_chan, g, None, &out),
        "shape",
    );
    assert_err("channel scales", run(&x, &q, &s, None, None, &out), "shape");
    // bias: dtype, shape.
    let b_short = DeviceTensor::from_f32(client, &vec![0.0; n - 1], &[n - 1], f).unwrap();
    assert_err(
        "bias shape",
        run(&x, &q, &s, g, Some(&b_short), &out),
        "shape",
    );
    let b_i32 = DeviceTensor::from_slice(client, &vec![0i32; n], &[n]).unwrap();
    assert_err(
        "bias dtype",
        run(&x, &q, &s, g, Some(&b_i32), &out),
        "dtype",
    );
    // out: shape, dtype.
    let out_bad = poisoned(client, &[m, n + 1], f);
    assert_err("out shape", run(&x, &q, &s, g, None, &out_bad), "shape");
    if caps::supports_dtype(client, DType::F16) {
        let out16 = poisoned(client, &[m, n], DType::F16);
        assert_err("out dtype", run(&x, &q, &s, g, None, &out16), "dtype");
    }
    // x: not float, not contiguous, bf16 where the runtime lacks it.
    let xi = DeviceTensor::from_slice(client, &vec![0i32; m * k], &[m, k]).unwrap();
    assert_err("x dtype", run(&xi, &q, &s, g, None, &out), "dtype");
    let big = DeviceTensor::from_f32(client, &vec![0.0; m * 2 * k], &[m, 2 * k], f).unwrap();
    let strided = big.view(&[m, k], &[2 * k, 1]).unwrap();
    assert_err("x strided", run(&strided, &q, &s, g, None, &out), "shape");
    if !caps::supports_dtype(client, DType::BF16) {
        let xb = DeviceTensor::from_f32(client, &vec![0.0; m * k], &[m, k], DType::BF16).unwrap();
        let ob = poisoned(client, &[m, n], DType::BF16);
        assert_err("x bf16", run(&xb, &q, &s, g, None, &ob), "dtype");
        assert_err(
            "layer bf16",
            W4A16Linear::from_dense(client, &w, [n, k], DType::BF16, None),
            "dtype",
        );
    }
    // Explicit kernels out of their range.
    let x17 = DeviceTensor::from_f32(client, &vec![0.0; 17 * k], &[17, k], f).unwrap();
    let out17 = poisoned(client, &[17, n], f);
    let gemv = W4a16Kernel::Gemv { cols_per_unit: 1 };
    assert_err(
        "gemv M > 16",
        w4a16_linear_into_with(client, &x17, &q, &s, g, None, &out17, gemv),
        "argument",
    );
    let gemv3 = W4a16Kernel::Gemv { cols_per_unit: 3 };
    assert_err(
        "cols_per_unit",
        w4a16_linear_into_with(client, &x, &q, &s, g, None, &out, gemv3),
        "argument",
    );

    // The layer.
    let l = |w: &[f32], shape: [usize; 2], g: Option<usize>| {
        W4A16Linear::from_dense(client, w, shape, f, g)
    };
    assert_err("layer K % 8", l(&vec![0.0; 12 * n], [n, 12], None), "shape");
    assert_err("layer K % g", l(&w, [n, k], Some(96)), "shape");
    assert_err("layer len", l(&w[1..], [n, k], None), "shape");
    let mut w_nan = w.clone();
    w_nan[7] = f32::NAN;
    assert_err("layer NaN", l(&w_nan, [n, k], None), "argument");
    let layer = l(&w, [n, k], g).unwrap();
    let none = Epilogue::NONE;
    let x_short = DeviceTensor::from_f32(client, &vec![0.0; m * 64], &[m, 64], f).unwrap();
    assert_err("forward K", layer.forward(client, &x_short, none), "shape");
    if caps::supports_dtype(client, DType::F16) {
        let x16 = DeviceTensor::from_f32(client, &vec![0.0; m * k], &[m, k], DType::F16).unwrap();
        assert_err("forward dtype", layer.forward(client, &x16, none), "dtype");
    }
    assert_err(
        "forward_into out",
        layer.forward_into(client, &x, none, &out_bad, None),
        "shape",
    );
    let short_bias = DeviceTensor::from_f32(client, &[0.0; 3], &[3], f).unwrap();
    let out = poisoned(client, &[m, n], f);
    assert_err(
        "layer bias",
        layer.forward_into(client, &x, none.bias(Some(&short_bias)), &out, None),
        "shape",
    );
}

#[test]
fn rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
