//! Decode steps as the model runs them: cache writes and attention at device positions, one
//! workspace reused over a growing cache.

use super::*;
use ops::attention::{attention_cached_into, kv_cache_write_into, AttentionWorkspace, KvLen};
use ops::DeviceTensor;

/// A decode loop as the model runs it: write the new row at the device position, attend over the
/// cache, advance the position by rewriting the buffer. Checked against the reference each step.
fn decode_loop_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(45);
    let dtype = DType::F32;
    let (hq, hkv, d, max_len, steps) = (12, 2, 64, 64, 6);
    let row = hkv * d;
    let kc = DeviceTensor::empty(client, &[max_len, hkv, d], dtype);
    let vc = DeviceTensor::empty(client, &[max_len, hkv, d], dtype);
    let pos = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let len = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    for step in 0..steps {
        let k_h = exact_values(&mut rng, row);
        let v_h = exact_values(&mut rng, row);
        let q_h = exact_values(&mut rng, hq * d);
        ks.extend_from_slice(&k_h);
        vs.extend_from_slice(&v_h);
        pos.write_bytes(client, &(step as u32).to_le_bytes())
            .unwrap();
        len.write_bytes(client, &(step as u32 + 1).to_le_bytes())
            .unwrap();
        let (k, _) = upload(client, &k_h, &[1, hkv, d], dtype);
        let (v, _) = upload(client, &v_h, &[1, hkv, d], dtype);
        let (q, _) = upload(client, &q_h, &[1, hq, d], dtype);
        let out = poisoned(client, &[1, hq, d], dtype);
        kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Device(&pos)).unwrap();
        attention_cached_into(client, &q, &kc, &vc, KvLen::Device(&len), 0.125, &out, None)
            .unwrap();
        let want = reference::attention::attention(
            &f(&q_h),
            &f(&ks),
            &f(&vs),
            1,
            step + 1,
            hq,
            hkv,
            d,
            0.125,
            true,
        );
        assert_close(
            &format!("decode step {step}"),
            &out.to_f64_vec(client).unwrap(),
            &want,
            attn_tol(dtype),
        );
    }
}

/// The model's pattern: one workspace (sized by `for_shapes` for the largest step) reused by
/// every call over a growing cache, a prefill of 37 tokens then decode steps of 1 and 3 queries,
/// cache writes at host and device starts. The device-length runs (workspace) and the
/// host-length runs (partials allocated per call) both match the reference.
fn cached_workspace_reused_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(46);
    let (max_len, hq, hkv, d) = (300usize, 12usize, 2usize, 64usize);
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    for dtype in float_dtypes(client) {
        let kc = poisoned(client, &[max_len, hkv, d], dtype);
        let vc = poisoned(client, &[max_len, hkv, d], dtype);
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let ws = AttentionWorkspace::for_shapes(client, 37, hq, hkv, d, max_len);
        let len_buf = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
        let mut len = 0usize;
        for (step, t) in [37usize, 1, 1, 3, 1].into_iter().enumerate() {
            let k_h = exact_values(&mut rng, t * hkv * d);
            let v_h = exact_values(&mut rng, t * hkv * d);
            let q_h = exact_values(&mut rng, t * hq * d);
            let (k, _) = upload(client, &k_h, &[t, hkv, d], dtype);
            let (v, _) = upload(client, &v_h, &[t, hkv, d], dtype);
            let (q, _) = upload(client, &q_h, &[t, hq, d], dtype);
            if step % 2 == 0 {
                kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Host(len)).unwrap();
            } else {
                len_buf
                    .write_bytes(client, &(len as u32).to_le_bytes())
                    .unwrap();
                kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Device(&len_buf)).unwrap();
            }
            ks.extend_from_slice(&k_h);
            vs.extend_from_slice(&v_h);
            len += t;
            let want = reference::attention::attention(
                &f(&q_h),
                &f(&ks),
                &f(&vs),
                t,
                len,
                hq,
                hkv,
                d,
                0.125,
                true,
            );
            len_buf
                .write_bytes(client, &(len as u32).to_le_bytes())
                .unwrap();
            for device in [true, false] {
                let (kv_len, ws) = if device {
                    (KvLen::Device(&len_buf), Some(&ws))
                } else {
                    (KvLen::Host(len), None)
                };
                let out = poisoned(client, &[t, hq, d], dtype);
                attention_cached_into(client, &q, &kc, &vc, kv_len, 0.125, &out, ws).unwrap();
                assert_close(
                    &format!("cached {dtype} step {step} len {len} device_len={device}"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    attn_tol(dtype),
                );
            }
        }
    }
}

/// Decode steps with [`KvLen::Appended`]: each attention follows the cache write of its newest
/// rows, over a cache long enough for several key splits and tiles per split, with 1-3 queries
/// per step so that the newest rows fall at every place in a tile (on CUDA with programmatic
/// dependent launch the older keys are then loaded before the kernel waits for the write).
fn appended_decode_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(47);
    let (max_len, hq, hkv, d) = (700usize, 12usize, 2usize, 128usize);
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    for dtype in float_dtypes(client) {
        let kc = poisoned(client, &[max_len, hkv, d], dtype);
        let vc = poisoned(client, &[max_len, hkv, d], dtype);
        let ws = AttentionWorkspace::for_shapes(client, 8, hq, hkv, d, max_len);
        let start = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
        let end = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        let mut len = 0usize;
        for (step, t) in [317usize, 1, 2, 1, 3, 1, 1, 8, 1].into_iter().enumerate() {
            let k_h = exact_values(&mut rng, t * hkv * d);
            let v_h = exact_values(&mut rng, t * hkv * d);
            let q_h = exact_values(&mut rng, t * hq * d);
            let (k, _) = upload(client, &k_h, &[t, hkv, d], dtype);
            let (v, _) = upload(client, &v_h, &[t, hkv, d], dtype);
            let (q, _) = upload(client, &q_h, &[t, hq, d], dtype);
            start
                .write_bytes(client, &(len as u32).to_le_bytes())
                .unwrap();
            end.write_bytes(client, &((len + t) as u32).to_le_bytes())
                .unwrap();
            let out = poisoned(client, &[t, hq, d], dtype);
            kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Device(&start)).unwrap();
            attention_cached_into(
                client,
                &q,
                &kc,
                &vc,
                KvLen::Appended(&end),
                0.125,
                &out,
                Some(&ws),
            )
            .unwrap();
            ks.extend_from_slice(&k_h);
            vs.extend_from_slice(&v_h);
            len += t;
            let want = reference::attention::attention(
                &f(&q_h),
                &f(&ks),
                &f(&vs),
                t,
                len,
                hq,
                hkv,
                d,
                0.125,
                true,
            );
            assert_close(
                &format!("appended {dtype} step {step} len {len}"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                attn_tol(dtype),
            );
        }
    }
}

#[test]
fn appended_decode_matches_reference() {
    on_each_runtime!(appended_decode_case);
}

#[test]
fn decode_loop_with_device_positions() {
    on_each_runtime!(decode_loop_case);
}

#[test]
fn cached_attention_reuses_one_workspace() {
    on_each_runtime!(cached_workspace_reused_case);
}
