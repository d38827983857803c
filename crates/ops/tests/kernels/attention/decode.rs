//! Decode steps as the model runs them: cache writes and attention at device positions, one
//! workspace reused over a growing cache.

use super::*;
use ops::attention::{attention_cached_into, kv_cache_write_into, AttentionWorkspace, KvLen};
use ops::DeviceTensor;

/// The host side of a growing cache (the keys and values appended so far) and the reference
/// over it.
struct History {
    hq: usize,
    hkv: usize,
    d: usize,
    ks: Vec<f32>,
    vs: Vec<f32>,
}

/// One step's random operands: `k`, `v` (`[t, Hkv, D]`) and `q` (`[t, Hq, D]`) on the device,
/// `q` also on the host.
struct Step<R: Runtime> {
    k: DeviceTensor<R>,
    v: DeviceTensor<R>,
    q: DeviceTensor<R>,
    q_h: Vec<f32>,
}

impl History {
    fn new(hq: usize, hkv: usize, d: usize) -> Self {
        Self {
            hq,
            hkv,
            d,
            ks: Vec::new(),
            vs: Vec::new(),
        }
    }

    /// Random keys, values and queries of `t` tokens; the keys and values join the history.
    fn step<R: Runtime>(
        &mut self,
        client: &ComputeClient<R>,
        rng: &mut StdRng,
        t: usize,
        dtype: DType,
    ) -> Step<R> {
        let (hq, hkv, d) = (self.hq, self.hkv, self.d);
        let k_h = exact_values(rng, t * hkv * d);
        let v_h = exact_values(rng, t * hkv * d);
        let q_h = exact_values(rng, t * hq * d);
        self.ks.extend_from_slice(&k_h);
        self.vs.extend_from_slice(&v_h);
        Step {
            k: upload(client, &k_h, &[t, hkv, d], dtype).0,
            v: upload(client, &v_h, &[t, hkv, d], dtype).0,
            q: upload(client, &q_h, &[t, hq, d], dtype).0,
            q_h,
        }
    }

    /// Causal attention (scale 0.125) of the `t` queries `q_h` over the whole history.
    fn want(&self, q_h: &[f32], t: usize) -> Vec<f64> {
        let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
        let len = self.ks.len() / (self.hkv * self.d);
        reference::attention::attention(
            &f(q_h),
            &f(&self.ks),
            &f(&self.vs),
            t,
            len,
            self.hq,
            self.hkv,
            self.d,
            0.125,
            true,
        )
    }
}

/// A decode loop as the model runs it: write the new row at the device position, attend over the
/// cache, advance the position by rewriting the buffer. Checked against the reference each step.
fn decode_loop_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(45);
    let dtype = DType::F32;
    let (hq, hkv, d, max_len, steps) = (12, 2, 64, 64, 6);
    let kc = DeviceTensor::empty(client, &[max_len, hkv, d], dtype);
    let vc = DeviceTensor::empty(client, &[max_len, hkv, d], dtype);
    let pos = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let len = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let mut history = History::new(hq, hkv, d);
    for step in 0..steps {
        let Step { k, v, q, q_h } = history.step(client, &mut rng, 1, dtype);
        pos.write_bytes(client, &(step as u32).to_le_bytes())
            .unwrap();
        len.write_bytes(client, &(step as u32 + 1).to_le_bytes())
            .unwrap();
        let out = poisoned(client, &[1, hq, d], dtype);
        kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Device(&pos)).unwrap();
        attention_cached_into(client, &q, &kc, &vc, KvLen::Device(&len), 0.125, &out, None)
            .unwrap();
        assert_close(
            &format!("decode step {step}"),
            &out.to_f64_vec(client).unwrap(),
            &history.want(&q_h, 1),
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
    for dtype in float_dtypes(client) {
        let kc = poisoned(client, &[max_len, hkv, d], dtype);
        let vc = poisoned(client, &[max_len, hkv, d], dtype);
        let mut history = History::new(hq, hkv, d);
        let ws = AttentionWorkspace::for_shapes(client, 37, hq, hkv, d, max_len);
        let len_buf = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
        let mut len = 0usize;
        for (step, t) in [37usize, 1, 1, 3, 1].into_iter().enumerate() {
            let Step { k, v, q, q_h } = history.step(client, &mut rng, t, dtype);
            if step % 2 == 0 {
                kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Host(len)).unwrap();
            } else {
                len_buf
                    .write_bytes(client, &(len as u32).to_le_bytes())
                    .unwrap();
                kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Device(&len_buf)).unwrap();
            }
            len += t;
            let want = history.want(&q_h, t);
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
    appended_decode_steps(client, 47, 700, 0, &[317, 1, 2, 1, 3, 1, 1, 8, 1]);
}

/// [`appended_decode_case`] after 11 500 rows written at once, in a 12 000-row cache: on CUDA
/// `Auto` then decodes on 128-key tiles with the merge kernel (the long-context tiling, chosen
/// where 128-key tiles still give every SM a cube: up to 188 SMs here).
fn long_cache_decode_case<R: Runtime>(client: &ComputeClient<R>) {
    appended_decode_steps(client, 48, 12_000, 11_500, &[1, 2, 1, 3]);
}

/// Writes `warm` rows, then runs `steps` appended decode steps of that many queries each over a
/// `max_len`-row cache, each checked against the reference.
fn appended_decode_steps<R: Runtime>(
    client: &ComputeClient<R>,
    seed: u64,
    max_len: usize,
    warm: usize,
    steps: &[usize],
) {
    let mut rng = rng(seed);
    let (hq, hkv, d) = (12usize, 2usize, 128usize);
    for dtype in float_dtypes(client) {
        let kc = poisoned(client, &[max_len, hkv, d], dtype);
        let vc = poisoned(client, &[max_len, hkv, d], dtype);
        let ws = AttentionWorkspace::for_shapes(client, 8, hq, hkv, d, max_len);
        let start = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
        let end = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
        let mut history = History::new(hq, hkv, d);
        let mut len = 0usize;
        if warm > 0 {
            let Step { k, v, .. } = history.step(client, &mut rng, warm, dtype);
            kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Host(0)).unwrap();
            len = warm;
        }
        for (step, &t) in steps.iter().enumerate() {
            let Step { k, v, q, q_h } = history.step(client, &mut rng, t, dtype);
            start
                .write_bytes(client, &(len as u32).to_le_bytes())
                .unwrap();
            end.write_bytes(client, &((len + t) as u32).to_le_bytes())
                .unwrap();
            let out = poisoned(client, &[t, hq, d], dtype);
            kv_cache_write_into(client, &k, &v, &kc, &vc, KvLen::Device(&start)).unwrap();
            let appended = KvLen::Appended(&end);
            attention_cached_into(client, &q, &kc, &vc, appended, 0.125, &out, Some(&ws)).unwrap();
            len += t;
            assert_close(
                &format!("appended {dtype} max_len {max_len} step {step} len {len}"),
                &out.to_f64_vec(client).unwrap(),
                &history.want(&q_h, t),
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
fn long_cache_decode_matches_reference() {
    on_each_runtime!(long_cache_decode_case);
}

#[test]
fn decode_loop_with_device_positions() {
    on_each_runtime!(decode_loop_case);
}

#[test]
fn cached_attention_reuses_one_workspace() {
    on_each_runtime!(cached_workspace_reused_case);
}
