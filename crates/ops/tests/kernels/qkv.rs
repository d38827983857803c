use cubecl::prelude::*;
use ops::qkv::{qkv_rope_cache_into, qkv_rope_cache_ragged_into, HeadShape, QkNorm};
use ops::reference::qkv as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

pub(crate) fn tables<R: Runtime>(
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

/// (T, Hq, Hkv, D, start): head dims 2..128, odd and equal head counts, T = 1, 3, 17.
const CASES: [(usize, usize, usize, usize, usize); 10] = [
    (1, 4, 2, 16, 0),
    (1, 12, 2, 128, 37),
    (17, 4, 2, 64, 5),
    (3, 14, 2, 128, 100),
    (3, 3, 1, 2, 7),
    (1, 3, 3, 2, 0),
    (17, 5, 5, 32, 0),
    (1, 7, 1, 64, 127),
    (3, 9, 3, 16, 60),
    (17, 1, 1, 128, 90),
];

fn qkv_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(11);
    for dtype in float_dtypes(client) {
        for &(t, hq, hkv, d, start) in &CASES {
            for with_norm in [false, true] {
                let max_len = 128;
                let width = (hq + 2 * hkv) * d;
                let (qkv, qkvh) = upload(
                    client,
                    &random(&mut rng, t * width, 1.5),
                    &[t, width],
                    dtype,
                );
                let around_one = |rng: &mut _| -> Vec<f32> {
                    random(rng, d, 0.5).into_iter().map(|v| 1.0 + v).collect()
                };
                let (qw, qwh) = upload(client, &around_one(&mut rng), &[d], dtype);
                let (kw, kwh) = upload(client, &around_one(&mut rng), &[d], dtype);
                let eps = 1e-6;
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
                let norm = with_norm.then_some(QkNorm {
                    q_weight: &qw,
                    k_weight: &kw,
                    eps: eps as f32,
                });
                let ref_norm = with_norm.then_some(reference::HeadNorm {
                    q_weight: &qwh,
                    k_weight: &kwh,
                    eps,
                });
                qkv_rope_cache_into(
                    client, &qkv, heads, &cos, &sin, &start_t, &q, &kc, &vc, norm,
                )
                .unwrap();
                let (wq, wk, wv) =
                    reference::qkv_rope(&qkvh, t, (hq, hkv, d), &ch, &sh, start, ref_norm);
                let what = format!("qkv {dtype} T{t} {hq}/{hkv}x{d} @{start} norm {with_norm}");
                let tol = tolerance(dtype);
                assert_close(&what, &q.to_f64_vec(client).unwrap(), &wq, tol);
                let rows = |c: &DeviceTensor<R>| {
                    let all = c.to_f64_vec(client).unwrap();
                    all[start * hkv * d..(start + t) * hkv * d].to_vec()
                };
                assert_close(&format!("{what} k"), &rows(&kc), &wk, tol);
                assert_close(&format!("{what} v"), &rows(&vc), &wv, 0.0);
                // Rows outside the appended range are untouched (still NaN).
                for (name, cache) in [("k", &kc), ("v", &vc)] {
                    let untouched = cache.to_f64_vec(client).unwrap();
                    assert!(
                        untouched[..start * hkv * d].iter().all(|v| v.is_nan()),
                        "{what}: wrote {name} below start"
                    );
                    assert!(
                        untouched[(start + t) * hkv * d..]
                            .iter()
                            .all(|v| v.is_nan()),
                        "{what}: wrote {name} past the end"
                    );
                }
            }
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
    assert!(
        qkv_rope_cache_into(client, &qkv, heads, &cos, &sin, &start, &q, &kc, &vc, None).is_ok()
    );
    assert_err(
        "qkv width",
        qkv_rope_cache_into(
            client,
            &f(&[2, 7]),
            heads,
            &cos,
            &sin,
            &start,
            &q,
            &kc,
            &vc,
            None,
        ),
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
            None,
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
            None,
        ),
        "shape",
    );
    let odd = HeadShape {
        head_dim: 7,
        ..heads
    };
    assert_err(
        "odd head_dim",
        qkv_rope_cache_into(client, &qkv, odd, &cos, &sin, &start, &q, &kc, &vc, None),
        "argument",
    );
    let bad_start = DeviceTensor::from_slice(client, &[0i32], &[1]).unwrap();
    assert_err(
        "start dtype",
        qkv_rope_cache_into(
            client, &qkv, heads, &cos, &sin, &bad_start, &q, &kc, &vc, None,
        ),
        "argument",
    );
    let half_cos = f(&[max_len, d]);
    assert_err(
        "table width",
        qkv_rope_cache_into(
            client, &qkv, heads, &half_cos, &sin, &start, &q, &kc, &vc, None,
        ),
        "shape",
    );
    let kh = DeviceTensor::empty(client, &[max_len, hkv, d], DType::F16);
    assert_err(
        "cache dtype",
        qkv_rope_cache_into(client, &qkv, heads, &cos, &sin, &start, &q, &kh, &vc, None),
        "dtype",
    );
    // The q/k norm weights: [head_dim] each, the activations' dtype, a usable eps.
    let (w, short) = (f(&[d]), f(&[d - 2]));
    let w16 = DeviceTensor::empty(client, &[d], DType::F16);
    let norm = |q_weight, k_weight, eps| {
        Some(QkNorm {
            q_weight,
            k_weight,
            eps,
        })
    };
    let run = |n| qkv_rope_cache_into(client, &qkv, heads, &cos, &sin, &start, &q, &kc, &vc, n);
    assert!(run(norm(&w, &w, 1e-6)).is_ok());
    assert_err("norm shape", run(norm(&w, &short, 1e-6)), "shape");
    assert_err("norm dtype", run(norm(&w16, &w, 1e-6)), "dtype");
    assert_err("norm eps", run(norm(&w, &w, f32::NAN)), "argument");
    assert_err("negative eps", run(norm(&w, &w, -1.0)), "argument");
}

/// The ragged batch: each row written at its own (position, slot), bit for bit what the
/// one-sequence launch writes for that token alone, and nothing else of the cache touched.
fn qkv_ragged_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(12);
    let (slots, max_len) = (3usize, 40usize);
    // (position, slot), one past the cache (not written).
    let rows: [(usize, usize); 4] = [(5, 2), (0, 0), (39, 1), (40, 0)];
    for dtype in float_dtypes(client) {
        for &(hq, hkv, d) in &[(4usize, 2usize, 16usize), (3, 1, 2), (14, 2, 128)] {
            for with_norm in [false, true] {
                let b = rows.len();
                let width = (hq + 2 * hkv) * d;
                let qkv_h = random(&mut rng, b * width, 1.5);
                let (qkv, _) = upload(client, &qkv_h, &[b, width], dtype);
                let weights: Vec<f32> = random(&mut rng, d, 0.5).iter().map(|v| 1.0 + v).collect();
                let (w, _) = upload(client, &weights, &[d], dtype);
                let norm = with_norm.then_some(QkNorm {
                    q_weight: &w,
                    k_weight: &w,
                    eps: 1e-6,
                });
                let (cos, sin, _, _) = tables(client, max_len, d);
                let table: Vec<u32> = rows
                    .iter()
                    .flat_map(|&(p, s)| [p as u32, s as u32])
                    .collect();
                let seqs = DeviceTensor::from_slice(client, &table, &[b, 2]).unwrap();
                let heads = HeadShape {
                    q_heads: hq,
                    kv_heads: hkv,
                    head_dim: d,
                };
                let q = poisoned(client, &[b, hq, d], dtype);
                let kc = poisoned(client, &[slots, max_len, hkv, d], dtype);
                let vc = poisoned(client, &[slots, max_len, hkv, d], dtype);
                qkv_rope_cache_ragged_into(
                    client, &qkv, heads, &cos, &sin, &seqs, &q, &kc, &vc, norm,
                )
                .unwrap();
                let (got_q, got_k, got_v) = (
                    q.to_f64_vec(client).unwrap(),
                    kc.to_f64_vec(client).unwrap(),
                    vc.to_f64_vec(client).unwrap(),
                );
                let row = hkv * d;
                let mut written = vec![false; slots * max_len];
                for (i, &(pos, slot)) in rows.iter().enumerate() {
                    let what =
                        format!("qkv ragged {dtype} {hq}/{hkv}x{d} norm {with_norm} row {i}");
                    let (one, _) = upload(
                        client,
                        &qkv_h[i * width..(i + 1) * width],
                        &[1, width],
                        dtype,
                    );
                    let start = DeviceTensor::from_slice(client, &[pos as u32], &[1]).unwrap();
                    let q1 = poisoned(client, &[1, hq, d], dtype);
                    let k1 = poisoned(client, &[max_len, hkv, d], dtype);
                    let v1 = poisoned(client, &[max_len, hkv, d], dtype);
                    qkv_rope_cache_into(
                        client, &one, heads, &cos, &sin, &start, &q1, &k1, &v1, norm,
                    )
                    .unwrap();
                    let same = |a: &[f64], b: &[f64]| {
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    assert!(
                        same(
                            &got_q[i * hq * d..(i + 1) * hq * d],
                            &q1.to_f64_vec(client).unwrap()
                        ),
                        "{what}: q"
                    );
                    if pos < max_len {
                        let at = (slot * max_len + pos) * row;
                        let k1 = k1.to_f64_vec(client).unwrap();
                        let v1 = v1.to_f64_vec(client).unwrap();
                        assert!(
                            same(&got_k[at..at + row], &k1[pos * row..(pos + 1) * row]),
                            "{what}: k"
                        );
                        assert!(
                            same(&got_v[at..at + row], &v1[pos * row..(pos + 1) * row]),
                            "{what}: v"
                        );
                        written[slot * max_len + pos] = true;
                    }
                }
                for (r, &w) in written.iter().enumerate() {
                    if !w {
                        assert!(
                            got_k[r * row..(r + 1) * row].iter().all(|v| v.is_nan())
                                && got_v[r * row..(r + 1) * row].iter().all(|v| v.is_nan()),
                            "qkv ragged {dtype}: cache row {r} written"
                        );
                    }
                }
            }
        }
    }
    // A seqs table of the wrong shape or a cache of the wrong rank is refused.
    let dtype = DType::F32;
    let (qkv, _) = upload(client, &[0.5; 2 * 32], &[2, 32], dtype);
    let (cos, sin, _, _) = tables(client, 8, 8);
    let heads = HeadShape {
        q_heads: 2,
        kv_heads: 1,
        head_dim: 8,
    };
    let q = poisoned(client, &[2, 2, 8], dtype);
    let kc = poisoned(client, &[2, 8, 1, 8], dtype);
    let short = DeviceTensor::from_slice(client, &[0u32, 0], &[1, 2]).unwrap();
    assert_err(
        "seqs of one row for two tokens",
        qkv_rope_cache_ragged_into(client, &qkv, heads, &cos, &sin, &short, &q, &kc, &kc, None),
        "shape",
    );
    let seqs = DeviceTensor::from_slice(client, &[0u32, 0, 1, 1], &[2, 2]).unwrap();
    let flat = poisoned(client, &[16, 1, 8], dtype);
    assert_err(
        "cache of rank 3",
        qkv_rope_cache_ragged_into(
            client, &qkv, heads, &cos, &sin, &seqs, &q, &flat, &flat, None,
        ),
        "shape",
    );
}

#[test]
fn qkv_rope_cache_ragged_matches_the_token_alone() {
    on_each_runtime!(qkv_ragged_case);
}

#[test]
fn qkv_rope_cache_matches_reference() {
    on_each_runtime!(qkv_case);
}

#[test]
fn qkv_rope_cache_rejects_bad_inputs() {
    on_each_runtime!(qkv_errors_case);
}
