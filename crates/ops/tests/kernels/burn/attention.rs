//! Attention on Burn tensors: causal GQA prefill, and decode over a KV cache filled by
//! `kv_cache_write`.

use super::*;

/// Attention's tolerance: the tensor-core kernels round the probabilities to the input dtype
/// before the P·V product, a second rounding beside the output's (as in the attention suite).
fn attn_tol(dtype: DType) -> f64 {
    2.0 * tolerance(dtype)
}

/// Burn's arithmetic for `q[B, Lq, Hq, D]`, `k`/`v` `[B, Lk, Hkv, D]`: KV heads repeated to the
/// query heads, `softmax(q·kᵀ·scale + mask)·v` with the causal rule `j <= i + Lk - Lq`.
fn attention_ref<R: CubeRuntime>(q: T<R>, k: T<R>, v: T<R>, scale: f32, causal: bool) -> T<R> {
    let (qs, ks) = (shape_of(&q), shape_of(&k));
    let (b, lq, hq, d) = (qs[0], qs[1], qs[2], qs[3]);
    let (lk, hkv) = (ks[1], ks[2]);
    let group = hq / hkv;
    let heads_first = |t: T<R>| B::<R>::float_permute(t, &[0, 2, 1, 3]);
    let repeat = |t: T<R>| {
        let t = B::<R>::float_reshape(heads_first(t), [b, hkv, 1, lk, d].into());
        let t = B::<R>::float_repeat_dim(t, 2, group);
        B::<R>::float_reshape(t, [b, hq, lk, d].into())
    };
    let (qh, kh, vh) = (heads_first(q), repeat(k), repeat(v));
    let scores = B::<R>::float_mul_scalar(matmul_nt::<R>(qh, kh), Scalar::Float(scale as f64));
    let scores = if causal {
        let mask: Vec<f32> = (0..lq)
            .flat_map(|i| {
                (0..lk).map(move |j| {
                    if j <= i + lk - lq {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = B::<R>::float_from_data(TensorData::new(mask, [1, 1, lq, lk]), &device::<R>());
        B::<R>::float_add(scores, mask)
    } else {
        scores
    };
    let out = matmul_nt::<R>(softmax_ref::<R>(scores), B::<R>::float_swap_dims(vh, 2, 3));
    heads_first(out)
}

/// A rank-3 `[L, H, D]` tensor as the reference's `[1, L, H, D]`.
fn batch_of_one<R: CubeRuntime>(t: T<R>) -> T<R> {
    let mut shape = shape_of(&t);
    shape.insert(0, 1);
    B::<R>::float_reshape(t, shape.into())
}

fn attention_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(31);
    // (batch, Lq, Lk, Hq, Hkv, D, causal): GQA groups 3, 7, 2 and 1, Lq below Lk, no batch dim.
    let shapes = [
        (None, 13usize, 13usize, 6usize, 2usize, 64usize, true),
        (None, 9, 9, 7, 1, 32, true),
        (Some(2usize), 5, 11, 4, 2, 64, true),
        (Some(2), 6, 10, 3, 3, 48, false),
    ];
    for dtype in float_dtypes(client) {
        for (i, &(batch, lq, lk, hq, hkv, d, causal)) in shapes.iter().enumerate() {
            let lead: Vec<usize> = batch.into_iter().collect();
            let shape = |l: usize, h: usize| [lead.clone(), vec![l, h, d]].concat();
            let (q_shape, kv_shape) = (shape(lq, hq), shape(lk, hkv));
            let n = |s: &[usize]| s.iter().product::<usize>();
            let q = random(&mut rng, n(&q_shape), 1.0);
            let k = random(&mut rng, n(&kv_shape), 1.0);
            let v = random(&mut rng, n(&kv_shape), 1.0);
            let r = q_shape.len();
            // Strided operands: q in Burn's [.., H, L, D] layout, or k and v, in turns.
            let (qt, qr) = if i % 2 == 0 {
                input_strided::<R>(&q, &q_shape, dtype, (r - 3, r - 2))
            } else {
                input::<R>(&q, &q_shape, dtype)
            };
            let (kt, kr) = if i % 2 == 1 {
                input_strided::<R>(&k, &kv_shape, dtype, (r - 3, r - 2))
            } else {
                input::<R>(&k, &kv_shape, dtype)
            };
            let (vt, vr) = if i % 2 == 1 {
                input_strided::<R>(&v, &kv_shape, dtype, last_two(&kv_shape))
            } else {
                input::<R>(&v, &kv_shape, dtype)
            };
            let scale = 1.0 / (d as f32).sqrt();
            let ours = ops::burn::attention(qt, kt, vt, scale, causal).expect("attention on burn");
            let want = if batch.is_some() {
                attention_ref::<R>(qr, kr, vr, scale, causal)
            } else {
                let want = attention_ref::<R>(
                    batch_of_one::<R>(qr),
                    batch_of_one::<R>(kr),
                    batch_of_one::<R>(vr),
                    scale,
                    causal,
                );
                B::<R>::float_reshape(want, q_shape.clone().into())
            };
            check(
                &format!(
                    "burn attention {dtype} b{batch:?} lq{lq} lk{lk} h{hq}/{hkv} d{d} causal={causal}"
                ),
                ours,
                want,
                dtype,
                attn_tol(dtype),
            );
        }
    }
}

/// A decode loop on Burn tensors: a prompt written into NaN-filled caches, then steps of one and
/// of three tokens, each followed by attention over the rows written so far (a row read past the
/// length would show as NaN). The caches' contents are checked row by row after the writes.
fn attention_cached_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(32);
    let (hq, hkv, d, max_len) = (6usize, 2usize, 64usize, 40usize);
    let row = hkv * d;
    let scale = 1.0 / (d as f32).sqrt();
    for dtype in float_dtypes(client) {
        let nan = vec![f32::NAN; max_len * row];
        let (mut k_cache, _) = input::<R>(&nan, &[max_len, hkv, d], dtype);
        let (mut v_cache, _) = input::<R>(&nan, &[max_len, hkv, d], dtype);
        let (mut k_all, mut v_all) = (Vec::new(), Vec::new());
        let mut len = 0;
        for (step, t) in [9usize, 1, 3].into_iter().enumerate() {
            let k = random(&mut rng, t * row, 1.0);
            let v = random(&mut rng, t * row, 1.0);
            // The prompt's k arrives in Burn's [H, T, D] layout (a strided view).
            let (kt, _) = if step == 0 {
                input_strided::<R>(&k, &[t, hkv, d], dtype, (0, 1))
            } else {
                input::<R>(&k, &[t, hkv, d], dtype)
            };
            let (vt, _) = input::<R>(&v, &[t, hkv, d], dtype);
            ops::burn::kv_cache_write(&mut k_cache, &mut v_cache, kt, vt, len)
                .expect("kv_cache_write on burn");
            k_all.extend(round_to(&k, dtype));
            v_all.extend(round_to(&v, dtype));
            len += t;

            // The queries: the last min(t, 2) positions, strided on the first step.
            let lq = t.min(2);
            let q = random(&mut rng, lq * hq * d, 1.0);
            let (qt, qr) = if step == 0 {
                input_strided::<R>(&q, &[lq, hq, d], dtype, (0, 1))
            } else {
                input::<R>(&q, &[lq, hq, d], dtype)
            };
            let ours =
                ops::burn::attention_cached(qt, k_cache.clone(), v_cache.clone(), len, scale)
                    .expect("attention_cached on burn");
            let host = |values: &[f64]| {
                let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
                B::<R>::float_from_data(TensorData::new(v, [1, len, hkv, d]), &device::<R>())
            };
            let want = attention_ref::<R>(
                batch_of_one::<R>(qr),
                host(&k_all),
                host(&v_all),
                scale,
                true,
            );
            check(
                &format!("burn attention_cached {dtype} len {len} lq {lq}"),
                ours,
                B::<R>::float_reshape(want, [lq, hq, d].into()),
                dtype,
                attn_tol(dtype),
            );
        }
        for (name, cache, written) in [("k", &k_cache, &k_all), ("v", &v_cache, &v_all)] {
            let got = read(cache.clone());
            assert_eq!(
                &got[..len * row],
                &written[..],
                "burn kv_cache_write {dtype}: {name} rows 0..{len}"
            );
            assert!(
                got[len * row..].iter().all(|x| x.is_nan()),
                "burn kv_cache_write {dtype}: {name} rows past {len} were written"
            );
        }
    }
}

/// The id of the device memory behind `t`, read from its debug form: cloning the handle to compare
/// it would itself make the buffer shared.
fn memory_id<R: CubeRuntime>(t: &T<R>) -> String {
    let debug = format!("{:?}", t.handle.memory);
    let start = debug
        .find("ManagedMemoryId")
        .expect("memory id in the handle's debug form");
    let end = start + debug[start..].find('}').expect("end of the memory id");
    debug[start..=end].to_string()
}

/// A cache that another tensor still holds is copied before the write: the other tensor keeps
/// its values, the written cache has the new rows. A cache held once is written in place.
fn kv_cache_write_shared_case<R: CubeRuntime>(_client: &ComputeClient<R>) {
    let (hkv, d, max_len) = (2usize, 32usize, 8usize);
    let row = hkv * d;
    let zeros = vec![0.0f32; max_len * row];
    let ones = vec![1.0f32; 2 * row];
    let (mut k_cache, _) = input::<R>(&zeros, &[max_len, hkv, d], DType::F32);
    let (mut v_cache, _) = input::<R>(&zeros, &[max_len, hkv, d], DType::F32);
    let k_before = k_cache.clone();
    let (k, _) = input::<R>(&ones, &[2, hkv, d], DType::F32);
    let (v, _) = input::<R>(&ones, &[2, hkv, d], DType::F32);
    let v_memory = memory_id(&v_cache);
    ops::burn::kv_cache_write(&mut k_cache, &mut v_cache, k, v, 3).expect("kv_cache_write");

    let mut want = zeros.iter().map(|&x| x as f64).collect::<Vec<_>>();
    want[3 * row..5 * row].fill(1.0);
    assert_eq!(read(k_cache), want, "written k cache");
    assert_eq!(read(v_cache.clone()), want, "written v cache");
    assert!(
        read(k_before).iter().all(|&x| x == 0.0),
        "a clone of the k cache saw the write"
    );
    assert_eq!(
        memory_id(&v_cache),
        v_memory,
        "a cache held once was copied instead of written in place"
    );
}

#[test]
fn attention_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(attention_case);
}

#[test]
fn attention_cached_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(attention_cached_case);
}

#[test]
fn kv_cache_write_on_burn_copies_shared_caches_only() {
    on_each_runtime!(kv_cache_write_shared_case);
}
