use cubecl::prelude::*;
use ops::elementwise::{add, add_into, swiglu, swiglu_concat, swiglu_concat_into, swiglu_into};
use ops::reference::elementwise as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

/// `a + b` into a NaN-poisoned output against the reference.
fn check_add<R: Runtime>(
    client: &ComputeClient<R>,
    what: &str,
    [a, b]: [&DeviceTensor<R>; 2],
    [ah, bh]: [&[f64]; 2],
) {
    let out = poisoned(client, a.shape(), a.dtype());
    add_into(client, a, b, &out).unwrap();
    assert_close(
        what,
        &out.to_f64_vec(client).unwrap(),
        &reference::add(ah, bh),
        tolerance(a.dtype()),
    );
}

fn add_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(21);
    for dtype in float_dtypes(client) {
        for &n in &AWKWARD {
            for rows in [1usize, 3] {
                let (a, ah) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
                let (b, bh) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
                let (r, rh) = upload(client, &random(&mut rng, n, 2.0), &[n], dtype);
                let what = format!("add {dtype} {rows}x{n}");
                check_add(client, &what, [&a, &b], [&ah, &bh]);
                check_add(client, &format!("{what} row"), [&a, &r], [&ah, &rh]);
            }
        }
    }
}

/// A tensor of several waves of cubes (8.4 M elements, 16-34 MB) whose vector count leaves a
/// partial last cube, out of place and in place (`out` is `a`).
fn add_large_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(24);
    let (rows, n) = (4099usize, 2056usize);
    for dtype in float_dtypes(client) {
        let (a, ah) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
        let (b, bh) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
        let want = reference::add(&ah, &bh);
        let out = poisoned(client, &[rows, n], dtype);
        add_into(client, &a, &b, &out).unwrap();
        let what = format!("add {dtype} {rows}x{n}");
        assert_close(
            &what,
            &out.to_f64_vec(client).unwrap(),
            &want,
            tolerance(dtype),
        );
        add_into(client, &a, &b, &a).unwrap();
        assert_close(
            &format!("{what} in place"),
            &a.to_f64_vec(client).unwrap(),
            &want,
            tolerance(dtype),
        );
    }
}

/// A chain of dependent kernels over tensors of several waves: each step reads the tensor the
/// step before wrote and overwrites the one that step read (adds and RMSNorms alternating over
/// two buffers). On CUDA sm_90+ every kernel is launched while its predecessor drains (PDL,
/// vendor/cubecl-cuda/PATCHED.md) and must wait for it before touching memory; a kernel that
/// read or wrote early would leave stale or overwritten values here.
fn dependent_chain_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(28);
    let (rows, n) = (2049usize, 4104usize);
    let dtype = DType::F32;
    let (mut x, mut xh) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
    let (b, bh) = upload(client, &random(&mut rng, rows * n, 2.0), &[rows, n], dtype);
    let (w, wh) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
    let mut y = poisoned(client, &[rows, n], dtype);
    for step in 0..24 {
        if step % 3 == 2 {
            ops::norm::rms_norm_into(client, &x, &w, 1e-6, &y).unwrap();
            xh = ops::reference::norm::rms_norm(&xh, &wh, 1e-6);
        } else {
            add_into(client, &x, &b, &y).unwrap();
            xh = reference::add(&xh, &bh);
        }
        std::mem::swap(&mut x, &mut y);
    }
    assert_close(
        "dependent chain f32",
        &x.to_f64_vec(client).unwrap(),
        &xh,
        1e-4,
    );
}

fn swiglu_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(22);
    for dtype in float_dtypes(client) {
        for &n in &AWKWARD {
            let (g, gh) = upload(client, &random(&mut rng, 3 * n, 4.0), &[3, n], dtype);
            let (u, uh) = upload(client, &random(&mut rng, 3 * n, 2.0), &[3, n], dtype);
            let out = poisoned(client, &[3, n], dtype);
            swiglu_into(client, &g, &u, &out).unwrap();
            assert_close(
                &format!("swiglu {dtype} {n}"),
                &out.to_f64_vec(client).unwrap(),
                &reference::swiglu(&gh, &uh),
                tolerance(dtype),
            );
        }
    }
}

/// The halves of one `[rows, 2n]` tensor against [`reference::swiglu`] on the split columns.
fn swiglu_concat_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(23);
    for dtype in float_dtypes(client) {
        for &n in &AWKWARD {
            let rows = 3;
            let (gu, h) = upload(
                client,
                &random(&mut rng, rows * 2 * n, 4.0),
                &[rows, 2 * n],
                dtype,
            );
            let (gate, up): (Vec<f64>, Vec<f64>) = (
                h.chunks(2 * n).flat_map(|r| r[..n].to_vec()).collect(),
                h.chunks(2 * n).flat_map(|r| r[n..].to_vec()).collect(),
            );
            let out = poisoned(client, &[rows, n], dtype);
            swiglu_concat_into(client, &gu, &out).unwrap();
            assert_close(
                &format!("swiglu_concat {dtype} {n}"),
                &out.to_f64_vec(client).unwrap(),
                &reference::swiglu(&gate, &up),
                tolerance(dtype),
            );
        }
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let a = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let b3 = DeviceTensor::from_f32(client, &[1.0; 3], &[3], DType::F32).unwrap();
    let bh = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F16).unwrap();
    let ids = DeviceTensor::from_slice(client, &[1i32; 12], &[3, 4]).unwrap();
    assert_err("add broadcast shape", add(client, &a, &b3), "shape");
    assert_err("add dtype", add(client, &a, &bh), "dtype");
    assert_err("add int", add(client, &ids, &ids), "dtype");
    assert_err("swiglu shape", swiglu(client, &a, &b3), "shape");
    assert_err("swiglu dtype", swiglu(client, &a, &bh), "dtype");
    assert_err("add out", add_into(client, &a, &a, &b3), "shape");
    let odd = DeviceTensor::from_f32(client, &[1.0; 9], &[3, 3], DType::F32).unwrap();
    assert_err("swiglu_concat odd", swiglu_concat(client, &odd), "shape");
    assert_err(
        "swiglu_concat out",
        swiglu_concat_into(client, &a, &a),
        "shape",
    );
    if !ops::caps::supports_dtype(client, DType::BF16) {
        let x = DeviceTensor::from_f32(client, &[1.0; 4], &[4], DType::BF16).unwrap();
        assert_err("bf16 unsupported", add(client, &x, &x), "dtype");
    }
}

/// A queued read sees every kernel queued before it: `b` added eight times over two buffers in
/// turn, then the last one read without waiting in between. Sizes on both sides of the 64 bytes
/// up to which a CUDA read is copied on a stream of its own (after an event on the queuing
/// stream).
fn queued_read_case<R: Runtime>(client: &ComputeClient<R>) {
    for n in [1usize, 16, 17, 1000] {
        let zeros = vec![0.0; n];
        let x = [0, 1].map(|_| DeviceTensor::from_f32(client, &zeros, &[n], DType::F32).unwrap());
        let step: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
        let b = DeviceTensor::from_f32(client, &step, &[n], DType::F32).unwrap();
        for k in 0..8 {
            add_into(client, &x[k % 2], &b, &x[1 - k % 2]).unwrap();
        }
        let got = x[0].read_queued(client).unwrap().wait::<f32>().unwrap();
        let want: Vec<f32> = step.iter().map(|v| 8.0 * v).collect();
        assert_eq!(got, want, "queued read of {n} f32 after eight adds");
    }
}

#[test]
fn queued_read_sees_the_work_before_it() {
    on_each_runtime!(queued_read_case);
}

#[test]
fn add_matches_reference() {
    on_each_runtime!(add_case);
}

#[test]
fn add_large_matches_reference() {
    on_each_runtime!(add_large_case);
}

#[test]
fn dependent_chain_matches_reference() {
    on_each_runtime!(dependent_chain_case);
}

#[test]
fn swiglu_matches_reference() {
    on_each_runtime!(swiglu_case);
}

#[test]
fn swiglu_concat_matches_reference() {
    on_each_runtime!(swiglu_concat_case);
}

#[test]
fn elementwise_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
