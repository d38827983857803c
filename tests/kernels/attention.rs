use crate::harness::*;
use crate::on_each_runtime;
use cubecl::prelude::*;
use ops::attention::{
    attention, attention_cached_into, attention_into, kv_cache_write_into, AttentionWorkspace,
    KvLen,
};
use ops::reference::attention as reference;
use ops::{DType, DeviceTensor};

fn on_cuda<R: Runtime>(client: &ComputeClient<R>) -> bool {
    ops::caps::runtime_name(client) == "cuda"
}

/// Tolerance relative to the output norm (the contract).
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        _ => 2e-2,
    }
}

/// (Lq, Lk, Hq, Hkv, D): a covering subset on lavapipe, the grid on CUDA.
fn shapes<R: Runtime>(client: &ComputeClient<R>) -> Vec<(usize, usize, usize, usize, usize)> {
    if on_cuda(client) {
        let mut s = Vec::new();
        for &lq in &[1usize, 2, 17, 128, 129] {
            for &lk in &[1usize, 17, 128, 1000, 4097] {
                if lq > lk {
                    continue;
                }
                for &(hq, hkv) in &[(1usize, 1usize), (4, 2), (12, 2), (14, 2)] {
                    for &d in &[64usize, 128] {
                        // Keep the f64 reference affordable: the big products on a subset.
                        if lq * lk * hq * d > 128 * 4097 * 4 * 64 && !(lq == 1 || d == 64) {
                            continue;
                        }
                        s.push((lq, lk, hq, hkv, d));
                    }
                }
            }
        }
        s
    } else {
        vec![
            (1, 1, 1, 1, 64),
            (1, 17, 4, 2, 64),
            (1, 1000, 12, 2, 128),
            (2, 17, 14, 2, 64),
            (17, 17, 4, 2, 64),
            (17, 128, 12, 2, 128),
            (128, 128, 1, 1, 64),
            (129, 129, 4, 2, 64),
        ]
    }
}

fn attention_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(81);
    let dtypes = float_dtypes(client);
    for (lq, lk, hq, hkv, d) in shapes(client) {
        for &dtype in &dtypes {
            // Large shapes: one dtype on lavapipe is enough to exercise the path.
            if !on_cuda(client) && lq * lk > 2000 && dtype != DType::F32 {
                continue;
            }
            let (q, qh) = upload(
                client,
                &random(&mut rng, lq * hq * d, 1.0),
                &[lq, hq, d],
                dtype,
            );
            let (k, kh) = upload(
                client,
                &random(&mut rng, lk * hkv * d, 1.0),
                &[lk, hkv, d],
                dtype,
            );
            let (v, vh) = upload(
                client,
                &random(&mut rng, lk * hkv * d, 1.0),
                &[lk, hkv, d],
                dtype,
            );
            let scale = 1.0 / (d as f32).sqrt();
            for causal in [false, true] {
                let out = poisoned(client, &[lq, hq, d], dtype);
                attention_into(client, &q, &k, &v, scale, causal, &out).unwrap();
                let want =
                    reference::attention(&qh, &kh, &vh, (lq, hq, hkv, d), lk, scale as f64, causal);
                let what =
                    format!("attention {dtype} Lq{lq} Lk{lk} {hq}/{hkv} D{d} causal={causal}");
                assert_close_norm(&what, &out.to_f64_vec(client).unwrap(), &want, tol(dtype));
            }
        }
    }
}

/// Decode over a cache: the length in a device buffer, a reused workspace, appends with
/// kv_cache_write; the same results as the host-length path.
fn cached_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(82);
    let (max_len, hq, hkv, d) = (300usize, 12usize, 2usize, 64usize);
    for dtype in float_dtypes(client) {
        let kc = poisoned(client, &[max_len, hkv, d], dtype);
        let vc = poisoned(client, &[max_len, hkv, d], dtype);
        let mut kh_all = Vec::new();
        let mut vh_all = Vec::new();
        let ws = AttentionWorkspace::for_shapes(client, 37, hq, hkv, d, max_len);
        let len_buf = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
        let mut len = 0usize;
        // A prefill of 37 tokens, then decode steps of 1 and a step of 3.
        for (step, t) in [37usize, 1, 1, 3, 1].into_iter().enumerate() {
            let (k, kh) = upload(
                client,
                &random(&mut rng, t * hkv * d, 1.0),
                &[t, hkv, d],
                dtype,
            );
            let (v, vh) = upload(
                client,
                &random(&mut rng, t * hkv * d, 1.0),
                &[t, hkv, d],
                dtype,
            );
            if step % 2 == 0 {
                kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Host(len)).unwrap();
            } else {
                len_buf
                    .write_bytes(client, &(len as u32).to_le_bytes())
                    .unwrap();
                kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Device(&len_buf)).unwrap();
            }
            kh_all.extend(kh);
            vh_all.extend(vh);
            len += t;
            let (q, qh) = upload(
                client,
                &random(&mut rng, t * hq * d, 1.0),
                &[t, hq, d],
                dtype,
            );
            let want =
                reference::attention(&qh, &kh_all, &vh_all, (t, hq, hkv, d), len, 0.125, true);
            let what = format!("cached {dtype} step {step} len {len}");
            let out = poisoned(client, &[t, hq, d], dtype);
            len_buf
                .write_bytes(client, &(len as u32).to_le_bytes())
                .unwrap();
            attention_cached_into(
                client,
                &q,
                &kc,
                &vc,
                KvLen::Device(&len_buf),
                0.125,
                &out,
                Some(&ws),
            )
            .unwrap();
            assert_close_norm(
                &format!("{what} device len"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                tol(dtype),
            );
            let out = poisoned(client, &[t, hq, d], dtype);
            attention_cached_into(client, &q, &kc, &vc, KvLen::Host(len), 0.125, &out, None)
                .unwrap();
            assert_close_norm(
                &format!("{what} host len"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                tol(dtype),
            );
        }
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let f = |shape: &[usize]| {
        DeviceTensor::from_f32(
            client,
            &vec![0.5; shape.iter().product()],
            shape,
            DType::F32,
        )
        .unwrap()
    };
    let (q, k, v) = (f(&[2, 4, 8]), f(&[5, 2, 8]), f(&[5, 2, 8]));
    assert!(attention(client, &q, &k, &v, 0.3, true).is_ok());
    assert_err(
        "head dim",
        attention(client, &q, &f(&[5, 2, 4]), &f(&[5, 2, 4]), 0.3, false),
        "shape",
    );
    assert_err(
        "v shape",
        attention(client, &q, &k, &f(&[4, 2, 8]), 0.3, false),
        "shape",
    );
    assert_err(
        "GQA ratio",
        attention(client, &f(&[2, 3, 8]), &k, &v, 0.3, false),
        "shape",
    );
    assert_err(
        "rank",
        attention(client, &f(&[2, 32]), &k, &v, 0.3, false),
        "shape",
    );
    assert_err(
        "scale",
        attention(client, &q, &k, &v, f32::NAN, false),
        "argument",
    );
    assert_err(
        "causal Lq > Lk",
        attention(client, &f(&[6, 4, 8]), &k, &v, 0.3, true),
        "argument",
    );
    let kh = DeviceTensor::from_f32(client, &[0.5; 80], &[5, 2, 8], DType::F16).unwrap();
    assert_err(
        "dtype",
        attention(client, &q, &kh, &kh, 0.3, false),
        "dtype",
    );
    let out = f(&[2, 4, 8]);
    assert_err(
        "kv_len 0",
        attention_cached_into(client, &q, &k, &v, KvLen::Host(0), 0.3, &out, None),
        "argument",
    );
    assert_err(
        "kv_len > max",
        attention_cached_into(client, &q, &k, &v, KvLen::Host(6), 0.3, &out, None),
        "argument",
    );
    let bad_len = DeviceTensor::from_slice(client, &[1i32], &[1]).unwrap();
    assert_err(
        "len dtype",
        attention_cached_into(client, &q, &k, &v, KvLen::Device(&bad_len), 0.3, &out, None),
        "argument",
    );
    let small = AttentionWorkspace::new(client, 1, 8);
    let long_k = f(&[4000, 2, 8]);
    assert_err(
        "workspace",
        attention_cached_into(
            client,
            &q,
            &long_k,
            &long_k,
            KvLen::Host(4000),
            0.3,
            &out,
            Some(&small),
        ),
        "argument",
    );
    // Cache writes.
    let (kn, vn) = (f(&[2, 2, 8]), f(&[2, 2, 8]));
    assert!(kv_cache_write_into(client, &kn, &vn, &k, &v, KvLen::Host(3)).is_ok());
    assert_err(
        "overflow",
        kv_cache_write_into(client, &kn, &vn, &k, &v, KvLen::Host(4)),
        "argument",
    );
    assert_err(
        "cache shape",
        kv_cache_write_into(client, &kn, &vn, &f(&[5, 1, 8]), &v, KvLen::Host(0)),
        "shape",
    );
}

#[test]
fn attention_matches_reference() {
    on_each_runtime!(attention_case);
}

#[test]
fn attention_over_cache_matches_reference() {
    on_each_runtime!(cached_case);
}

#[test]
fn attention_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
