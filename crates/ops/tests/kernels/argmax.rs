use cubecl::prelude::*;
use ops::argmax::{argmax, argmax_into};
use ops::reference::elementwise as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

fn argmax_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(41);
    for dtype in float_dtypes(client) {
        for &n in AWKWARD.iter().chain(&[151_936usize]) {
            let rows = if n > 10_000 { 2 } else { 5 };
            let mut v = random(&mut rng, rows * n, 4.0);
            if n > 3 {
                // A tie for the maximum in row 0: the first index must win.
                let m = v[..n].iter().cloned().fold(f32::MIN, f32::max) + 1.0;
                v[n / 3] = m;
                v[n - 1] = m;
            }
            let (x, xh) = upload(client, &v, &[rows, n], dtype);
            let out = DeviceTensor::from_slice(client, &vec![u32::MAX; rows], &[rows]).unwrap();
            argmax_into(client, &x, &out).unwrap();
            assert_exact(
                &format!("argmax {dtype} {rows}x{n}"),
                &out.to_vec::<u32>(client).unwrap(),
                &reference::argmax(&xh, n),
            );
        }
        // NaN never wins; a row of only NaN gives 0.
        let x = DeviceTensor::from_f32(
            client,
            &[f32::NAN, 1.0, f32::NAN, 0.5, f32::NAN, f32::NAN],
            &[3, 2],
            dtype,
        )
        .unwrap();
        assert_exact(
            "argmax NaN",
            &argmax(client, &x).unwrap().to_vec::<u32>(client).unwrap(),
            &[1, 1, 0],
        );
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let x = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let wrong = DeviceTensor::empty(client, &[4], DType::U32);
    let wrong_dtype = DeviceTensor::empty(client, &[3], DType::I32);
    assert_err("out len", argmax_into(client, &x, &wrong), "shape");
    assert_err("out dtype", argmax_into(client, &x, &wrong_dtype), "shape");
    let ids = DeviceTensor::from_slice(client, &[1u32; 4], &[4]).unwrap();
    assert_err("int input", argmax(client, &ids), "dtype");
}

#[test]
fn argmax_matches_reference() {
    on_each_runtime!(argmax_case);
}

#[test]
fn argmax_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
