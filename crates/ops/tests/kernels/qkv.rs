use cubecl::prelude::*;
use ops::qkv::{qkv_rope_cache_into, HeadShape};
use ops::reference::qkv as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

fn tables<R: Runtime>(
    client: &ComputeClient<R>,
    rows: usize,
    d: usize,
) -> (DeviceTensor<R>, DeviceTensor<R>, Vec<f64>, Vec<f64>) {
    let (cos, sin) = reference::rope_tables(rows, d, 10000.0);
    let c32: Vec<f32> = cos.iter().map(|&v| v as f32).collect();
    let s32: Vec<f32> = sin.iter().map(|&v| v as f32).collect();
    let ct = DeviceTensor::from_slice(client, &c32, &[rows, d / 2]).unwrap();
    let st = DeviceTensor::from_slice(client, &s32, &[rows, d / 2]).unwrap();
    (
        ct,
        st,
        c32.iter().map(|&v| v as f64).collect(),
        s32.iter().map(|&v| v as f64).collect(),
    )
}

fn qkv_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(11);
    for dtype in float_dtypes(client) {
        for &(t, hq, hkv, d, start) in &[
            (1usize, 4usize, 2usize, 16usize, 0usize),
            (1, 12, 2, 128, 37),
            (17, 4, 2, 64, 5),
            (3, 14, 2, 128, 100),
        ] {
            let max_len = 128;
            let width = (hq + 2 * hkv) * d;
            let (qkv, qkvh) = upload(
                client,
                &random(&mut rng, t * width, 1.5),
                &[t, width],
                dtype,
            );
            let (cos, sin, ch, sh) = tables(client, max_len, d);
            let start_t = DeviceTensor::from_slice(client, &[start as u32], &[1]).unwrap();
            let q = poisoned(client, &[t, hq, d], dtype);
            let kc = poisoned(client, &[max_len, hkv, d], dtype);
            let vc = poisoned(client, &[max_len, hkv, d], dtype);
            let heads = HeadShape {
                q_heads: hq,
                kv_heads: hkv,
                head_dim: d,
            };
            qkv_rope_cache_into(client, &qkv, heads, &cos, &sin, &start_t, &q, &kc, &vc).unwrap();
            let (wq, wk, wv) = reference::qkv_rope(&qkvh, t, (hq, hkv, d), &ch, &sh, start);
            let what = format!("qkv {dtype} T{t} {hq}/{hkv}x{d} @{start}");
            assert_close(&what, &q.to_f64_vec(client).unwrap(), &wq, tolerance(dtype));
            let rows = |c: &DeviceTensor<R>| {
                let all = c.to_f64_vec(client).unwrap();
                all[start * hkv * d..(start + t) * hkv * d].to_vec()
            };
            assert_close(&format!("{what} k"), &rows(&kc), &wk, tolerance(dtype));
            assert_close(&format!("{what} v"), &rows(&vc), &wv, 0.0);
            // Rows outside the appended range are untouched (still NaN).
            let untouched = kc.to_f64_vec(client).unwrap();
            assert!(
                untouched[..start * hkv * d].iter().all(|v| v.is_nan()),
                "{what}: wrote below start"
            );
            assert!(
                untouched[(start + t) * hkv * d..]
                    .iter()
                    .all(|v| v.is_nan()),
                "{what}: wrote past the end"
            );
        }
    }
}

fn qkv_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let (hq, hkv, d, max_len) = (4, 2, 8, 16);
    let heads = HeadShape {
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
    };
    let f = |shape: &[usize]| DeviceTensor::empty(client, shape, DType::F32);
    let (cos, sin, _, _) = tables(client, max_len, d);
    let start = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let qkv = f(&[2, (hq + 2 * hkv) * d]);
    let (q, kc, vc) = (f(&[2, hq, d]), f(&[max_len, hkv, d]), f(&[max_len, hkv, d]));
    assert!(qkv_rope_cache_into(client, &qkv, heads, &cos, &sin, &start, &q, &kc, &vc).is_ok());
    assert_err(
        "qkv width",
        qkv_rope_cache_into(client, &f(&[2, 7]), heads, &cos, &sin, &start, &q, &kc, &vc),
        "shape",
    );
    assert_err(
        "q_out",
        qkv_rope_cache_into(
            client,
            &qkv,
            heads,
            &cos,
            &sin,
            &start,
            &f(&[1, hq, d]),
            &kc,
            &vc,
        ),
        "shape",
    );
    assert_err(
        "cache",
        qkv_rope_cache_into(
            client,
            &qkv,
            heads,
            &cos,
            &sin,
            &start,
            &q,
            &f(&[max_len, 1, d]),
            &vc,
        ),
        "shape",
    );
    let odd = HeadShape {
        head_dim: 7,
        ..heads
    };
    assert_err(
        "odd head_dim",
        qkv_rope_cache_into(client, &qkv, odd, &cos, &sin, &start, &q, &kc, &vc),
        "argument",
    );
    let bad_start = DeviceTensor::from_slice(client, &[0i32], &[1]).unwrap();
    assert_err(
        "start dtype",
        qkv_rope_cache_into(client, &qkv, heads, &cos, &sin, &bad_start, &q, &kc, &vc),
        "argument",
    );
    let half_cos = f(&[max_len, d]);
    assert_err(
        "table width",
        qkv_rope_cache_into(client, &qkv, heads, &half_cos, &sin, &start, &q, &kc, &vc),
        "shape",
    );
    let kh = DeviceTensor::empty(client, &[max_len, hkv, d], DType::F16);
    assert_err(
        "cache dtype",
        qkv_rope_cache_into(client, &qkv, heads, &cos, &sin, &start, &q, &kh, &vc),
        "dtype",
    );
}

#[test]
fn qkv_rope_cache_matches_reference() {
    on_each_runtime!(qkv_case);
}

#[test]
fn qkv_rope_cache_rejects_bad_inputs() {
    on_each_runtime!(qkv_errors_case);
}
