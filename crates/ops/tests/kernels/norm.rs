use cubecl::prelude::*;
use ops::norm::{rms_norm, rms_norm_into, rms_norm_residual_into};
use ops::reference;
use ops::{DType, DeviceTensor};
use testkit::*;

fn rms_norm_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(1);
    for dtype in float_dtypes(client) {
        for &n in &AWKWARD {
            for rows in [1usize, 3, 17] {
                let (x, xh) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
                let (w, wh) = upload(client, &random(&mut rng, n, 1.5), &[n], dtype);
                let out = poisoned(client, &[rows, n], dtype);
                rms_norm_into(client, &x, &w, 1e-6, &out).unwrap();
                let want = reference::norm::rms_norm(&xh, &wh, 1e-6);
                assert_close(
                    &format!("rms_norm {dtype} {rows}x{n}"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    tolerance(dtype),
                );
            }
        }
    }
}

fn rms_norm_residual_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(2);
    for dtype in float_dtypes(client) {
        for &n in &AWKWARD {
            let rows = 5;
            let (x, xh) = upload(client, &random(&mut rng, rows * n, 1.0), &[rows, n], dtype);
            let (r, rh) = upload(client, &random(&mut rng, rows * n, 1.0), &[rows, n], dtype);
            let (w, wh) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
            let out = poisoned(client, &[rows, n], dtype);
            let sum = poisoned(client, &[rows, n], dtype);
            rms_norm_residual_into(client, &x, &r, &w, 1e-5, &out, &sum).unwrap();
            // The device rounds the sum to the dtype before normalising it: so does the reference.
            let sum_dev = sum.to_f64_vec(client).unwrap();
            let (_, want_sum) = reference::norm::rms_norm_residual(&xh, &rh, &wh, 1e-5);
            assert_close(
                &format!("residual sum {dtype} {n}"),
                &sum_dev,
                &want_sum,
                tolerance(dtype),
            );
            let want = reference::norm::rms_norm(&sum_dev, &wh, 1e-5);
            assert_close(
                &format!("rms_norm_residual {dtype} {n}"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                tolerance(dtype),
            );
        }
    }
}

fn rms_norm_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let x = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let w3 = DeviceTensor::from_f32(client, &[1.0; 3], &[3], DType::F32).unwrap();
    let w4h = DeviceTensor::from_f32(client, &[1.0; 4], &[4], DType::F16).unwrap();
    let w4 = DeviceTensor::from_f32(client, &[1.0; 4], &[4], DType::F32).unwrap();
    let ids = DeviceTensor::from_slice(client, &[1i32; 12], &[3, 4]).unwrap();
    assert_err("weight length", rms_norm(client, &x, &w3, 1e-6), "shape");
    assert_err("weight dtype", rms_norm(client, &x, &w4h, 1e-6), "dtype");
    assert_err("int input", rms_norm(client, &ids, &w4, 1e-6), "dtype");
    assert_err("negative eps", rms_norm(client, &x, &w4, -1.0), "argument");
    assert_err("nan eps", rms_norm(client, &x, &w4, f32::NAN), "argument");
    let wrong_out = DeviceTensor::empty(client, &[4, 3], DType::F32);
    assert_err(
        "out shape",
        rms_norm_into(client, &x, &w4, 1e-6, &wrong_out),
        "shape",
    );
    let strided = x.view(&[4, 3], &[1, 4]).unwrap();
    let w3f = DeviceTensor::from_f32(client, &[1.0; 3], &[3], DType::F32).unwrap();
    assert_err(
        "non-contiguous",
        rms_norm(client, &strided, &w3f, 1e-6),
        "shape",
    );
    if !ops::caps::supports_dtype(client, DType::BF16) {
        let xb = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::BF16).unwrap();
        let wb = DeviceTensor::from_f32(client, &[1.0; 4], &[4], DType::BF16).unwrap();
        assert_err(
            "bf16 unsupported",
            rms_norm(client, &xb, &wb, 1e-6),
            "dtype",
        );
    }
}

#[test]
fn rms_norm_matches_reference() {
    on_each_runtime!(rms_norm_case);
}

#[test]
fn rms_norm_residual_matches_reference() {
    on_each_runtime!(rms_norm_residual_case);
}

#[test]
fn rms_norm_rejects_bad_inputs() {
    on_each_runtime!(rms_norm_errors_case);
}
