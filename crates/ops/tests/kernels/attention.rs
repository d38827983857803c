use cubecl::prelude::*;
use ops::attention::{
    attention, attention_cached_into, attention_cached_into_with, attention_into,
    attention_into_with, kv_cache_write_into, AttentionStrategy, AttentionWorkspace, KvLen,
};
use ops::{caps, reference, DType, DeviceTensor};
use rand::rngs::StdRng;
use testkit::*;

/// The tolerances, relative to the output (|want| + rms(want)).
fn attn_tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        DType::BF16 => 2e-2,
        _ => 0.0,
    }
}

fn is_cuda<R: Runtime>(client: &ComputeClient<R>) -> bool {
    caps::runtime_name(client).contains("cuda")
}

/// Values in [-1, 1] that bf16, f16 and f32 all hold exactly, so that one f64 reference serves
/// every dtype of a shape.
fn exact_values(rng: &mut StdRng, n: usize) -> Vec<f32> {
    random(rng, n, 1.0)
        .into_iter()
        .map(|x| {
            let b = half::bf16::from_f32(x).to_f32();
            if b.abs() < 1e-4 {
                0.25
            } else {
                b
            }
        })
        .collect()
}

struct Shape {
    batch: usize,
    lq: usize,
    lk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
}

impl Shape {
    fn new(lq: usize, lk: usize, hq: usize, hkv: usize, d: usize, causal: bool) -> Self {
        Self {
            batch: 1,
            lq,
            lk,
            hq,
            hkv,
            d,
            causal,
        }
    }

    fn name(&self) -> String {
        format!(
            "b{} lq{} lk{} h{}/{} d{}{}",
            self.batch,
            self.lq,
            self.lk,
            self.hq,
            self.hkv,
            self.d,
            if self.causal { " causal" } else { "" }
        )
    }

    fn q_shape(&self) -> Vec<usize> {
        let s = vec![self.lq, self.hq, self.d];
        if self.batch > 1 {
            [vec![self.batch], s].concat()
        } else {
            s
        }
    }

    fn k_shape(&self) -> Vec<usize> {
        let s = vec![self.lk, self.hkv, self.d];
        if self.batch > 1 {
            [vec![self.batch], s].concat()
        } else {
            s
        }
    }
}

/// Inputs of a shape and their reference output (computed once for every dtype).
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    want: Vec<f64>,
    scale: f32,
}

fn inputs(rng: &mut StdRng, s: &Shape) -> Inputs {
    let q = exact_values(rng, s.batch * s.lq * s.hq * s.d);
    let k = exact_values(rng, s.batch * s.lk * s.hkv * s.d);
    let v = exact_values(rng, s.batch * s.lk * s.hkv * s.d);
    // A scale above 1/sqrt(d) sharpens the softmax so that masking mistakes show.
    let scale = 2.0 / (s.d as f32).sqrt();
    let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
    let want = reference::attention::attention_batched(
        &f(&q),
        &f(&k),
        &f(&v),
        s.batch,
        s.lq,
        s.lk,
        s.hq,
        s.hkv,
        s.d,
        scale as f64,
        s.causal,
    );
    Inputs {
        q,
        k,
        v,
        want,
        scale,
    }
}

fn check<R: Runtime>(
    client: &ComputeClient<R>,
    s: &Shape,
    x: &Inputs,
    dtype: DType,
    strategy: AttentionStrategy,
) {
    let (q, _) = upload(client, &x.q, &s.q_shape(), dtype);
    let (k, _) = upload(client, &x.k, &s.k_shape(), dtype);
    let (v, _) = upload(client, &x.v, &s.k_shape(), dtype);
    let out = poisoned(client, &s.q_shape(), dtype);
    attention_into_with(client, &q, &k, &v, x.scale, s.causal, &out, strategy)
        .unwrap_or_else(|e| panic!("{} {dtype} {strategy:?}: {e}", s.name()));
    assert_close(
        &format!("attention {} {dtype} {strategy:?}", s.name()),
        &out.to_f64_vec(client).unwrap(),
        &x.want,
        attn_tol(dtype),
    );
}

/// The grid: every runtime runs a covering subset (lavapipe is a CPU); CUDA runs the full
/// cross product of Lq x Lk x heads x D x causal (Lq <= Lk when causal) in every dtype.
fn attention_grid_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(40);
    let shapes: Vec<Shape> = if is_cuda(client) {
        let mut v = Vec::new();
        for &lq in &[1usize, 2, 17, 128, 129] {
            for &lk in &[1usize, 17, 128, 1000, 4097] {
                for &(hq, hkv) in &[(1usize, 1usize), (4, 2), (12, 2), (14, 2)] {
                    for &d in &[64usize, 128] {
                        for causal in [false, true] {
                            if !(causal && lq > lk) {
                                v.push(Shape::new(lq, lk, hq, hkv, d, causal));
                            }
                        }
                    }
                }
            }
        }
        v
    } else {
        vec![
            Shape::new(1, 1, 1, 1, 64, false),
            Shape::new(1, 1000, 12, 2, 128, true),
            Shape::new(2, 17, 4, 2, 64, true),
            Shape::new(2, 4097, 4, 2, 64, false),
            Shape::new(17, 128, 14, 2, 128, true),
            Shape::new(128, 128, 4, 2, 64, true),
            Shape::new(129, 17, 1, 1, 128, false),
            Shape::new(17, 1000, 12, 2, 64, false),
        ]
    };
    let start = std::time::Instant::now();
    for (n, s) in shapes.iter().enumerate() {
        let x = inputs(&mut rng, s);
        for dtype in float_dtypes(client) {
            // On CUDA the production dtype (bf16) covers the whole grid, the others a third.
            if is_cuda(client) && dtype != DType::BF16 && n % 3 != 0 {
                continue;
            }
            check(client, s, &x, dtype, AttentionStrategy::Auto);
        }
        if n % 100 == 99 {
            eprintln!("attention grid: {} shapes in {:?}", n + 1, start.elapsed());
        }
    }
}

/// Each kernel on its own (where the runtime has it), on shapes that are awkward for its tiles:
/// the tiled kernel also with a head dim that is no multiple of 8 and with a batch.
fn attention_kernels_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(41);
    // A negative scale is legal; the tensor-core kernels keep maxima in raw score units and
    // leave it to the tiled kernel.
    let neg = Shape::new(20, 31, 4, 2, 64, true);
    let mut x = inputs(&mut rng, &neg);
    x.scale = -x.scale;
    let f = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
    x.want = reference::attention::attention(
        &f(&x.q),
        &f(&x.k),
        &f(&x.v),
        neg.lq,
        neg.lk,
        neg.hq,
        neg.hkv,
        neg.d,
        x.scale as f64,
        true,
    );
    for dtype in float_dtypes(client) {
        check(client, &neg, &x, dtype, AttentionStrategy::Auto);
    }
    let mut batched = Shape::new(19, 33, 4, 2, 64, true);
    batched.batch = 3;
    let shapes = [
        Shape::new(3, 40, 14, 2, 40, true),
        Shape::new(20, 31, 4, 2, 64, false),
        Shape::new(1, 300, 12, 2, 128, false),
        Shape::new(5, 77, 4, 2, 64, true),
        Shape::new(33, 65, 12, 2, 128, true),
        Shape::new(70, 70, 1, 1, 64, false),
        batched,
    ];
    for s in &shapes {
        let x = inputs(&mut rng, s);
        for dtype in float_dtypes(client) {
            check(client, s, &x, dtype, AttentionStrategy::Tiled);
            for strategy in [
                AttentionStrategy::TensorCore,
                AttentionStrategy::Decode,
                AttentionStrategy::TensorCoreDecode,
            ] {
                let (q, _) = upload(client, &x.q, &s.q_shape(), dtype);
                let (k, _) = upload(client, &x.k, &s.k_shape(), dtype);
                let out = poisoned(client, &s.q_shape(), dtype);
                match attention_into_with(client, &q, &k, &k, x.scale, s.causal, &out, strategy) {
                    Ok(()) => check(client, s, &x, dtype, strategy),
                    Err(e) => assert_eq!(e.kind(), "feature", "{strategy:?}: {e}"),
                }
            }
        }
    }
}

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
                let strategies: &[AttentionStrategy] = if is_cuda(client) {
                    &[
                        AttentionStrategy::Auto,
                        AttentionStrategy::Tiled,
                        AttentionStrategy::Decode,
                        AttentionStrategy::TensorCore,
                        AttentionStrategy::TensorCoreDecode,
                    ]
                } else {
                    &[AttentionStrategy::Auto]
                };
                for &strategy in strategies {
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

fn attention_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let t = |shape: &[usize], dtype: DType| {
        let n: usize = shape.iter().product();
        DeviceTensor::from_f32(client, &vec![0.5; n], shape, dtype).unwrap()
    };
    let f = DType::F32;
    let q = t(&[3, 4, 8], f);
    let k = t(&[5, 2, 8], f);
    let v = t(&[5, 2, 8], f);
    assert!(attention(client, &q, &k, &v, 0.3, true).is_ok());
    assert_err(
        "k dtype",
        attention(client, &q, &t(&[5, 2, 8], DType::F16), &v, 0.3, false),
        "dtype",
    );
    assert_err(
        "int q",
        attention(
            client,
            &DeviceTensor::from_slice(client, &[1i32; 96], &[3, 4, 8]).unwrap(),
            &k,
            &v,
            0.3,
            false,
        ),
        "dtype",
    );
    assert_err(
        "v shape",
        attention(client, &q, &k, &t(&[4, 2, 8], f), 0.3, false),
        "shape",
    );
    assert_err(
        "head dim",
        attention(client, &q, &t(&[5, 2, 4], f), &t(&[5, 2, 4], f), 0.3, false),
        "shape",
    );
    assert_err(
        "heads not a multiple",
        attention(client, &q, &t(&[5, 3, 8], f), &t(&[5, 3, 8], f), 0.3, false),
        "shape",
    );
    assert_err(
        "rank",
        attention(client, &t(&[12, 8], f), &k, &v, 0.3, false),
        "shape",
    );
    assert_err(
        "rank mix",
        attention(client, &t(&[1, 3, 4, 8], f), &k, &v, 0.3, false),
        "shape",
    );
    assert_err(
        "batch mismatch",
        attention(
            client,
            &t(&[2, 3, 4, 8], f),
            &t(&[3, 5, 2, 8], f),
            &t(&[3, 5, 2, 8], f),
            0.3,
            false,
        ),
        "shape",
    );
    assert_err(
        "head dim too large",
        attention(
            client,
            &t(&[1, 1, 264], f),
            &t(&[1, 1, 264], f),
            &t(&[1, 1, 264], f),
            0.3,
            false,
        ),
        "shape",
    );
    assert_err(
        "causal lq > lk",
        attention(client, &t(&[6, 4, 8], f), &k, &v, 0.3, true),
        "argument",
    );
    assert!(attention(client, &t(&[6, 4, 8], f), &k, &v, 0.3, false).is_ok());
    assert_err(
        "nan scale",
        attention(client, &q, &k, &v, f32::NAN, false),
        "argument",
    );
    assert_err(
        "out shape",
        attention_into(client, &q, &k, &v, 0.3, false, &t(&[3, 4, 9], f)),
        "shape",
    );
    assert_err(
        "out dtype",
        attention_into(client, &q, &k, &v, 0.3, false, &t(&[3, 4, 8], DType::F16)),
        "dtype",
    );
    let strided = t(&[8, 4, 3], f).view(&[3, 4, 8], &[1, 3, 12]).unwrap();
    assert_err(
        "non-contiguous",
        attention(client, &strided, &k, &v, 0.3, false),
        "shape",
    );
    if !caps::supports_dtype(client, DType::BF16) {
        let b = DType::BF16;
        assert_err(
            "bf16 unsupported",
            attention(
                client,
                &t(&[3, 4, 8], b),
                &t(&[5, 2, 8], b),
                &t(&[5, 2, 8], b),
                0.3,
                false,
            ),
            "dtype",
        );
    }
    if !caps::has_plane_ops(client) {
        assert_err(
            "decode needs plane ops",
            attention_into_with(
                client,
                &q,
                &k,
                &v,
                0.3,
                false,
                &t(&[3, 4, 8], f),
                AttentionStrategy::Decode,
            ),
            "feature",
        );
    }
    assert_err(
        "tensor cores need f16/bf16",
        attention_into_with(
            client,
            &q,
            &k,
            &v,
            0.3,
            false,
            &t(&[3, 4, 8], f),
            AttentionStrategy::TensorCore,
        ),
        "feature",
    );

    // The cached form.
    let kc = t(&[10, 2, 8], f);
    let vc = t(&[10, 2, 8], f);
    let out = t(&[3, 4, 8], f);
    let len_ok = DeviceTensor::from_slice(client, &[4u32], &[1]).unwrap();
    assert!(attention_cached_into(client, &q, &kc, &vc, KvLen::Host(4), 0.3, &out, None).is_ok());
    assert!(attention_cached_into(
        client,
        &q,
        &kc,
        &vc,
        KvLen::Device(&len_ok),
        0.3,
        &out,
        None
    )
    .is_ok());
    assert_err(
        "len past cache",
        attention_cached_into(client, &q, &kc, &vc, KvLen::Host(11), 0.3, &out, None),
        "argument",
    );
    assert_err(
        "len below lq",
        attention_cached_into(client, &q, &kc, &vc, KvLen::Host(2), 0.3, &out, None),
        "argument",
    );
    assert_err(
        "len zero",
        attention_cached_into(
            client,
            &t(&[1, 4, 8], f),
            &kc,
            &vc,
            KvLen::Host(0),
            0.3,
            &t(&[1, 4, 8], f),
            None,
        ),
        "argument",
    );
    let len_i32 = DeviceTensor::from_slice(client, &[4i32], &[1]).unwrap();
    assert_err(
        "len dtype",
        attention_cached_into(
            client,
            &q,
            &kc,
            &vc,
            KvLen::Device(&len_i32),
            0.3,
            &out,
            None,
        ),
        "dtype",
    );
    let len_2 = DeviceTensor::from_slice(client, &[4u32, 4], &[2]).unwrap();
    assert_err(
        "len shape",
        attention_cached_into(client, &q, &kc, &vc, KvLen::Device(&len_2), 0.3, &out, None),
        "shape",
    );
    assert_err(
        "cached batch",
        attention_cached_into(
            client,
            &t(&[1, 3, 4, 8], f),
            &t(&[1, 10, 2, 8], f),
            &t(&[1, 10, 2, 8], f),
            KvLen::Host(4),
            0.3,
            &t(&[1, 3, 4, 8], f),
            None,
        ),
        "shape",
    );
    assert_err(
        "cache shapes",
        attention_cached_into(
            client,
            &q,
            &kc,
            &t(&[9, 2, 8], f),
            KvLen::Host(4),
            0.3,
            &out,
            None,
        ),
        "shape",
    );

    // A workspace too small for the split partials of a long cache (4000 keys are always split).
    let small = AttentionWorkspace::new(client, 1, 8);
    let long_k = t(&[4000, 2, 8], f);
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

    // The cache write.
    let nk = t(&[2, 2, 8], f);
    assert!(kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Host(8)).is_ok());
    assert_err(
        "write overflow",
        kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Host(9)),
        "argument",
    );
    assert_err(
        "write huge start",
        kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Host(usize::MAX)),
        "argument",
    );
    assert_err(
        "write row shape",
        kv_cache_write_into(
            client,
            &t(&[2, 2, 4], f),
            &t(&[2, 2, 4], f),
            &kc,
            &vc,
            KvLen::Host(0),
        ),
        "shape",
    );
    assert_err(
        "write k/v differ",
        kv_cache_write_into(client, &nk, &t(&[3, 2, 8], f), &kc, &vc, KvLen::Host(0)),
        "shape",
    );
    assert_err(
        "write dtype",
        kv_cache_write_into(
            client,
            &t(&[2, 2, 8], DType::F16),
            &t(&[2, 2, 8], DType::F16),
            &kc,
            &vc,
            KvLen::Host(0),
        ),
        "dtype",
    );
    assert_err(
        "write start dtype",
        kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Device(&len_i32)),
        "dtype",
    );
    assert_err(
        "write rank",
        kv_cache_write_into(
            client,
            &t(&[2, 16], f),
            &t(&[2, 16], f),
            &kc,
            &vc,
            KvLen::Host(0),
        ),
        "shape",
    );
}

#[test]
fn attention_matches_reference() {
    on_each_runtime!(attention_grid_case);
}

#[test]
fn attention_each_kernel_matches_reference() {
    on_each_runtime!(attention_kernels_case);
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

#[test]
fn decode_loop_with_device_positions() {
    on_each_runtime!(decode_loop_case);
}

#[test]
fn cached_attention_reuses_one_workspace() {
    on_each_runtime!(cached_workspace_reused_case);
}

#[test]
fn attention_rejects_bad_inputs() {
    on_each_runtime!(attention_errors_case);
}
