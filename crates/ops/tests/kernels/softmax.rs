use cubecl::prelude::*;
use ops::reference::elementwise as reference;
use ops::softmax::{softmax, softmax_into};
use ops::{DType, DeviceTensor};
use testkit::*;

fn softmax_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(51);
    for dtype in float_dtypes(client) {
        for &n in &AWKWARD {
            let (x, xh) = upload(client, &random(&mut rng, 3 * n, 8.0), &[3, n], dtype);
            let out = poisoned(client, &[3, n], dtype);
            softmax_into(client, &x, &out).unwrap();
            assert_close(
                &format!("softmax {dtype} {n}"),
                &out.to_f64_vec(client).unwrap(),
                &reference::softmax(&xh, n),
                tolerance(dtype),
            );
        }
        // Large logits (no overflow thanks to the max shift) and masked (-inf) entries.
        let v = [1000.0, 999.0, f32::NEG_INFINITY, 998.0];
        let (x, xh) = upload(client, &v, &[1, 4], dtype);
        let got = softmax(client, &x).unwrap().to_f64_vec(client).unwrap();
        assert_close(
            &format!("softmax shifted {dtype}"),
            &got,
            &reference::softmax(&xh, 4),
            tolerance(dtype),
        );
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let x = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let out = DeviceTensor::empty(client, &[4, 3], DType::F32);
    assert_err("out shape", softmax_into(client, &x, &out), "shape");
    let ids = DeviceTensor::from_slice(client, &[1u32; 4], &[4]).unwrap();
    assert_err("int input", softmax(client, &ids), "dtype");
}

#[test]
fn softmax_matches_reference() {
    on_each_runtime!(softmax_case);
}

#[test]
fn softmax_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
