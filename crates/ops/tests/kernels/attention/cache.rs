//! The KV-cache paths: the cache write, and attention over the first `len` rows of a larger cache
//! with the length on the host or on the device.

use super::*;
use ops::attention::{
    attention_cached_into, attention_cached_into_with, kv_cache_write_into, AttentionWorkspace,
    KvLen,
};
use ops::DeviceTensor;

/// The cache path: attention over the first `len` rows of a larger cache whose rows past `len`
/// hold NaN (so reading one shows), with the length on the host and on the device.
fn attention_cached_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(42);
    let (hq, hkv, max_len) = (12, 2, 1100);
    for dtype in float_dtypes(client) {
        for d in [64usize, 128] {
            for &(lq, len) in &[(1usize, 1000usize), (2, 1000), (17, 1000), (1, 1), (5, 5)] {
                let s = Shape::new(lq, len, hq, hkv, d, true);
                let x = inputs(&mut rng, &s);
                let row = hkv * d;
                let mut kc = vec![f32::NAN; max_len * row];
                let mut vc = vec![f32::NAN; max_len * row];
                kc[..len * row].copy_from_slice(&x.k);
                vc[..len * row].copy_from_slice(&x.v);
                let (q, _) = upload(client, &x.q, &[lq, hq, d], dtype);
                let (kc, _) = upload(client, &kc, &[max_len, hkv, d], dtype);
                let (vc, _) = upload(client, &vc, &[max_len, hkv, d], dtype);
                let dev_len = DeviceTensor::from_slice(client, &[len as u32], &[1]).unwrap();
                // The device-length runs write their partials into a workspace (the model's
                // decode step), the host-length runs allocate them.
                let ws = AttentionWorkspace::for_shapes(client, lq, hq, hkv, d, max_len);
                let strategies: Vec<AttentionStrategy> = if is_cuda(client) {
                    [AttentionStrategy::Auto, AttentionStrategy::Tiled]
                        .into_iter()
                        .chain(forced_strategies())
                        .collect()
                } else {
                    vec![AttentionStrategy::Auto]
                };
                for strategy in strategies {
                    for device in [false, true] {
                        let kv_len = if device {
                            KvLen::Device(&dev_len)
                        } else {
                            KvLen::Host(len)
                        };
                        let out = poisoned(client, &[lq, hq, d], dtype);
                        match attention_cached_into_with(
                            client,
                            &q,
                            &kc,
                            &vc,
                            kv_len,
                            x.scale,
                            &out,
                            device.then_some(&ws),
                            strategy,
                        ) {
                            Ok(()) => {}
                            Err(e) if strategy != AttentionStrategy::Auto => {
                                assert_eq!(e.kind(), "feature", "{strategy:?}: {e}");
                                continue;
                            }
                            Err(e) => panic!("{e}"),
                        }
                        assert_close(
                            &format!(
                                "cached {} {dtype} {strategy:?} device_len={device}",
                                s.name()
                            ),
                            &out.to_f64_vec(client).unwrap(),
                            &x.want,
                            attn_tol(dtype),
                        );
                    }
                }
            }
        }
    }
}

/// A device length is read when the kernel runs: the same launch arguments with the buffer
/// rewritten give the attention over the new length. A length below Lq leaves queries that see
/// no row (zeros); a length past the cache is clamped to it.
fn attention_device_len_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(43);
    let dtype = DType::F32;
    let (lq, hq, hkv, d, max_len) = (2, 4, 2, 64, 300);
    let row = hkv * d;
    let kc_h = exact_values(&mut rng, max_len * row);
    let vc_h = exact_values(&mut rng, max_len * row);
    let q_h = exact_values(&mut rng, lq * hq * d);
    let (q, _) = upload(client, &q_h, &[lq, hq, d], dtype);
    let (kc, _) = upload(client, &kc_h, &[max_len, hkv, d], dtype);
    let (vc, _) = upload(client, &vc_h, &[max_len, hkv, d], dtype);
    let dev_len = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let scale = 0.2f32;
    for &(len, eff) in &[
        (7usize, 7usize),
        (300, 300),
        (123, 123),
        (1, 1),
        (5000, 300),
    ] {
        dev_len
            .write_bytes(client, &(len as u32).to_le_bytes())
            .unwrap();
        let out = poisoned(client, &[lq, hq, d], dtype);
        attention_cached_into(
            client,
            &q,
            &kc,
            &vc,
            KvLen::Device(&dev_len),
            scale,
            &out,
            None,
        )
        .unwrap();
        let mut want = if eff >= lq {
            reference::attention::attention(
                &f(&q_h),
                &f(&kc_h[..eff * row]),
                &f(&vc_h[..eff * row]),
                lq,
                eff,
                hq,
                hkv,
                d,
                scale as f64,
                true,
            )
        } else {
            vec![0.0; lq * hq * d]
        };
        if eff < lq {
            // Query 1 sees row 0 when eff == 1; query 0 sees nothing (zeros).
            let one = reference::attention::attention(
                &f(&q_h[hq * d..]),
                &f(&kc_h[..row]),
                &f(&vc_h[..row]),
                1,
                1,
                hq,
                hkv,
                d,
                scale as f64,
                true,
            );
            want[hq * d..].copy_from_slice(&one);
        }
        assert_close(
            &format!("device len {len}"),
            &out.to_f64_vec(client).unwrap(),
            &want,
            attn_tol(dtype),
        );
    }
}

fn kv_cache_write_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(44);
    for dtype in float_dtypes(client) {
        let (hkv, d, max_len) = (2, 40, 37);
        let row = hkv * d;
        let kc_h = random(&mut rng, max_len * row, 1.0);
        let vc_h = random(&mut rng, max_len * row, 1.0);
        for &(t, start, device) in &[
            (1usize, 0usize, false),
            (5, 3, false),
            (1, 36, true),
            (17, 20, true),
            (4, 35, true),
            (3, 4000, true),
        ] {
            let (kc, kc_r) = upload(client, &kc_h, &[max_len, hkv, d], dtype);
            let (vc, vc_r) = upload(client, &vc_h, &[max_len, hkv, d], dtype);
            let (k, k_r) = upload(client, &random(&mut rng, t * row, 1.0), &[t, hkv, d], dtype);
            let (v, v_r) = upload(client, &random(&mut rng, t * row, 1.0), &[t, hkv, d], dtype);
            let dev = DeviceTensor::from_slice(client, &[start as u32], &[1]).unwrap();
            let at = if device {
                KvLen::Device(&dev)
            } else {
                KvLen::Host(start)
            };
            kv_cache_write_into(client, &k, &v, &kc, &vc, at).unwrap();
            let what = format!("kv_cache_write {dtype} t{t} start{start} device={device}");
            let got_k = kc.to_f64_vec(client).unwrap();
            let got_v = vc.to_f64_vec(client).unwrap();
            let want_k = reference::attention::kv_cache_write(&kc_r, &k_r, row, start);
            let want_v = reference::attention::kv_cache_write(&vc_r, &v_r, row, start);
            assert_exact(&what, &got_k, &want_k);
            assert_exact(&what, &got_v, &want_v);
        }
    }
}

#[test]
fn attention_cached_matches_reference() {
    on_each_runtime!(attention_cached_case);
}

#[test]
fn attention_device_len_is_read_at_run_time() {
    on_each_runtime!(attention_device_len_case);
}

#[test]
fn kv_cache_write_matches_reference() {
    on_each_runtime!(kv_cache_write_case);
}
