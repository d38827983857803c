//! The errors of `bsr_linear`: every invalid input and launch shape.

use cubecl::prelude::*;
use ops::{DType, DeviceTensor};
use sparse::{bsr_linear, bsr_linear_into, bsr_linear_into_tuned, Bsr, Tuning};
use testkit::*;

fn linear_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let f = DType::F32;
    let mut rng = rng(79);
    let dense = random(&mut rng, 64 * 32, 1.0);
    let w = Bsr::from_dense(client, &dense, [64, 32], 16, f).unwrap();
    let x = DeviceTensor::from_f32(client, &random(&mut rng, 3 * 32, 1.0), &[3, 32], f).unwrap();
    assert!(bsr_linear(client, &x, &w, None).is_ok());
    // Block sizes other than 16/32/64 are refused by the kernel (the format allows them).
    let w8 = Bsr::from_dense(client, &dense, [64, 32], 8, f).unwrap();
    assert_err("block 8", bsr_linear(client, &x, &w8, None), "argument");
    // K of x must be the weight's K.
    let x48 = DeviceTensor::from_f32(client, &[0.5; 3 * 48], &[3, 48], f).unwrap();
    assert_err("K mismatch", bsr_linear(client, &x48, &w, None), "shape");
    let x16 = DeviceTensor::from_f32(client, &[0.5; 3 * 16], &[3, 16], f).unwrap();
    assert_err(
        "K not the weight's",
        bsr_linear(client, &x16, &w, None),
        "shape",
    );
    // Output shape and dtype.
    let bad_out = DeviceTensor::empty(client, &[3, 32], f);
    assert_err(
        "out shape",
        bsr_linear_into(client, &x, &w, None, &bad_out),
        "shape",
    );
    let half_out = DeviceTensor::empty(client, &[3, 64], DType::F16);
    assert_err(
        "out dtype",
        bsr_linear_into(client, &x, &w, None, &half_out),
        "dtype",
    );
    // Bias shape and dtype.
    let b32 = DeviceTensor::from_f32(client, &[0.0; 32], &[32], f).unwrap();
    assert_err(
        "bias shape",
        bsr_linear(client, &x, &w, Some(&b32)),
        "shape",
    );
    let bh = DeviceTensor::from_f32(client, &[0.0; 64], &[64], DType::F16).unwrap();
    assert_err("bias dtype", bsr_linear(client, &x, &w, Some(&bh)), "dtype");
    // Weight dtype must match the input.
    let wh = Bsr::from_dense(client, &dense, [64, 32], 16, DType::F16).unwrap();
    assert_err("weight dtype", bsr_linear(client, &x, &wh, None), "dtype");
    // Integer input, non-contiguous input.
    let ids = DeviceTensor::from_slice(client, &[1i32; 96], &[3, 32]).unwrap();
    assert_err("int input", bsr_linear(client, &ids, &w, None), "dtype");
    let big = DeviceTensor::from_f32(client, &[0.5; 32 * 32], &[32, 32], f).unwrap();
    let strided = big.view(&[3, 32], &[1, 32]).unwrap();
    assert_err("strided", bsr_linear(client, &strided, &w, None), "shape");
    // A launch shape that cannot work.
    let out = DeviceTensor::empty(client, &[3, 64], f);
    assert_err(
        "bad tuning",
        bsr_linear_into_tuned(
            client,
            &x,
            &w,
            None,
            &out,
            Tuning {
                tile_m: Some(24),
                ..Tuning::default()
            },
        ),
        "argument",
    );
    // A one-stage pipeline, and a pipeline where the runtime cannot issue async copies (or
    // the path has no tensor cores), are refused the same way.
    for stages in [1, 5] {
        assert_err(
            "bad pipeline depth",
            bsr_linear_into_tuned(
                client,
                &x,
                &w,
                None,
                &out,
                Tuning {
                    stages: Some(stages),
                    ..Tuning::default()
                },
            ),
            "argument",
        );
    }
    if !client.features().copy_async || !sparse::linear::uses_tensor_cores(client, f) {
        assert_err(
            "pipeline without async copies",
            bsr_linear_into_tuned(
                client,
                &x,
                &w,
                None,
                &out,
                Tuning {
                    stages: Some(3),
                    ..Tuning::default()
                },
            ),
            "argument",
        );
    }
    if !ops::caps::supports_dtype(client, DType::BF16) {
        let xb = DeviceTensor::from_f32(client, &[0.5; 96], &[3, 32], DType::BF16).unwrap();
        assert_err("bf16", bsr_linear(client, &xb, &w, None), "dtype");
    }
}

#[test]
fn bsr_linear_rejects_bad_inputs() {
    on_each_runtime!(linear_errors_case);
}
