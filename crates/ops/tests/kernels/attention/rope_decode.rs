//! The decode step's attention block from the QKV row (`rope_attention_decode_into`): against
//! the f64 reference (RoPE, the cache append, attention over the cache) and against the two
//! launches it replaces on CUDA (`qkv_rope_cache_into`, then `attention_cached_into`), on the
//! same cache contents.

use super::*;
use crate::qkv::tables;
use ops::attention::{
    attention_cached_into, rope_attention_decode_into, AttentionWorkspace, KvLen,
};
use ops::qkv::{qkv_rope_cache_into, HeadShape, QkNorm};
use ops::DeviceTensor;

/// (Hq, Hkv, D, newest position, cache rows): the 1.5B model's heads, groups of 7, 1 and 8,
/// head dims 32 to 128; the newest key alone, first and last of a 128-key tile, in a clustered
/// launch (up to 1 024 rows) and in a split launch with its merge (4 096).
const CASES: [(usize, usize, usize, usize, usize); 7] = [
    (12, 2, 128, 639, 704),
    (12, 2, 128, 0, 704),
    (7, 1, 64, 128, 300),
    (7, 1, 64, 127, 300),
    (4, 4, 32, 57, 1024),
    (12, 2, 128, 3000, 4096),
    (16, 2, 128, 4095, 4096),
];

/// The f64 reference of the block at position `pos` over a cache whose rows before it are
/// `old` (keys, values): the (normed) rotated q and k, the append, the attention over the
/// `pos + 1` rows with scale `1 / sqrt(D)`. Returns the output and the appended key.
fn reference_block(
    qkv: &[f64],
    (hq, hkv, d): (usize, usize, usize),
    (cos, sin): (&[f64], &[f64]),
    pos: usize,
    norm: Option<reference::qkv::HeadNorm<'_>>,
    (k_old, v_old): (&[f64], &[f64]),
) -> (Vec<f64>, Vec<f64>) {
    let row = hkv * d;
    let (wq, wk, wv) = reference::qkv::qkv_rope(qkv, 1, (hq, hkv, d), cos, sin, pos, norm);
    let keys = [&k_old[..pos * row], &wk[..]].concat();
    let values = [&v_old[..pos * row], &wv[..]].concat();
    let scale = 1.0 / (d as f32).sqrt();
    let out = reference::attention::attention(
        &wq,
        &keys,
        &values,
        1,
        pos + 1,
        hq,
        hkv,
        d,
        scale as f64,
        true,
    );
    (out, wk)
}

fn rope_decode_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(77);
    for dtype in float_dtypes(client) {
        for &(hq, hkv, d, pos, max_len) in &CASES {
            let (row, width, len) = (hkv * d, (hq + 2 * hkv) * d, pos + 1);
            let (qkv, qkv_h) = upload(client, &random(&mut rng, width, 1.5), &[1, width], dtype);
            // The older rows hold keys and values; the newest row and those past it NaN, so
            // that a missing append or a read past the length shows.
            let older = |rng: &mut _| {
                let mut c = random(rng, max_len * row, 1.0);
                c[pos * row..].iter_mut().for_each(|v| *v = f32::NAN);
                c
            };
            let (k_old, v_old) = (older(&mut rng), older(&mut rng));
            let cache = |c: &[f32]| upload(client, c, &[max_len, hkv, d], dtype);
            let ((kc, k_old_h), (vc, v_old_h)) = (cache(&k_old), cache(&v_old));
            let ((kc2, _), (vc2, _)) = (cache(&k_old), cache(&v_old));
            let (cos, sin, cos_h, sin_h) = tables(client, max_len, d);
            let start = DeviceTensor::from_slice(client, &[pos as u32], &[1]).unwrap();
            let end = DeviceTensor::from_slice(client, &[len as u32], &[1]).unwrap();
            let heads = HeadShape {
                q_heads: hq,
                kv_heads: hkv,
                head_dim: d,
            };
            let scale = 1.0 / (d as f32).sqrt();
            let ws = AttentionWorkspace::for_shapes(client, 1, hq, hkv, d, max_len);
            let what = format!("{dtype} {hq}/{hkv}x{d} @{pos} of {max_len}");

            let tables_h = (&cos_h[..], &sin_h[..]);
            let old_h = (&k_old_h[..], &v_old_h[..]);
            let (want, _) = reference_block(&qkv_h, (hq, hkv, d), tables_h, pos, None, old_h);

            // The two launches, on their own copy of the cache.
            let q2 = poisoned(client, &[1, hq, d], dtype);
            let out2 = poisoned(client, &[1, hq, d], dtype);
            qkv_rope_cache_into(
                client, &qkv, heads, &cos, &sin, &start, &q2, &kc2, &vc2, None,
            )
            .unwrap();
            attention_cached_into(
                client,
                &q2,
                &kc2,
                &vc2,
                KvLen::Appended(&end),
                scale,
                &out2,
                Some(&ws),
            )
            .unwrap();
            let two = out2.to_f64_vec(client).unwrap();

            for (name, kv_len) in [
                ("appended", KvLen::Appended(&end)),
                ("host", KvLen::Host(len)),
            ] {
                let q = poisoned(client, &[1, hq, d], dtype);
                let out = poisoned(client, &[1, hq, d], dtype);
                rope_attention_decode_into(
                    client,
                    &qkv,
                    heads,
                    &cos,
                    &sin,
                    &start,
                    &kc,
                    &vc,
                    None,
                    kv_len,
                    scale,
                    &q,
                    &out,
                    Some(&ws),
                )
                .unwrap();
                let what = format!("{what} {name}");
                let got = out.to_f64_vec(client).unwrap();
                assert_close_norm(&what, &got, &want, attn_tol(dtype));
                assert_close_norm(
                    &format!("{what} vs two launches"),
                    &got,
                    &two,
                    tolerance(dtype),
                );
                // The caches: the appended row as the separate kernel writes it (the value
                // copied, the key rotated by the same arithmetic), the older rows kept, the rows
                // past the newest untouched.
                let caches = [(&kc, &kc2, "k", tolerance(dtype)), (&vc, &vc2, "v", 0.0)];
                for (c, c2, label, tol) in caches {
                    let (a, b) = (
                        c.to_f64_vec(client).unwrap(),
                        c2.to_f64_vec(client).unwrap(),
                    );
                    assert_close(
                        &format!("{what} {label} cache"),
                        &a[..len * row],
                        &b[..len * row],
                        tol,
                    );
                    assert!(
                        a[len * row..].iter().all(|v| v.is_nan()),
                        "{what}: wrote {label} past the newest row"
                    );
                }
            }
        }
    }
}

/// The same entry point with per-head q/k norms (Qwen3), which it runs as the norm-applying
/// RoPE kernel and then the attention: the output and the appended key against the f64
/// reference (norm, RoPE, append, attention), on the cases up to 1 024 cache rows.
fn rope_decode_qk_norm_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(78);
    for dtype in float_dtypes(client) {
        for &(hq, hkv, d, pos, max_len) in CASES.iter().filter(|c| c.4 <= 1024) {
            let (row, width, len) = (hkv * d, (hq + 2 * hkv) * d, pos + 1);
            let (qkv, qkv_h) = upload(client, &random(&mut rng, width, 1.5), &[1, width], dtype);
            let around_one = |rng: &mut _| -> Vec<f32> {
                random(rng, d, 0.5).into_iter().map(|v| 1.0 + v).collect()
            };
            let (qw, qw_h) = upload(client, &around_one(&mut rng), &[d], dtype);
            let (kw, kw_h) = upload(client, &around_one(&mut rng), &[d], dtype);
            let eps = 1e-6;
            let old = |rng: &mut _| {
                let mut c = random(rng, max_len * row, 1.0);
                c[pos * row..].iter_mut().for_each(|v| *v = f32::NAN);
                upload(client, &c, &[max_len, hkv, d], dtype)
            };
            let ((kc, k_old_h), (vc, v_old_h)) = (old(&mut rng), old(&mut rng));
            let (cos, sin, cos_h, sin_h) = tables(client, max_len, d);
            let start = DeviceTensor::from_slice(client, &[pos as u32], &[1]).unwrap();
            let end = DeviceTensor::from_slice(client, &[len as u32], &[1]).unwrap();
            let heads = HeadShape {
                q_heads: hq,
                kv_heads: hkv,
                head_dim: d,
            };
            let norm = QkNorm {
                q_weight: &qw,
                k_weight: &kw,
                eps: eps as f32,
            };
            let ref_norm = reference::qkv::HeadNorm {
                q_weight: &qw_h,
                k_weight: &kw_h,
                eps,
            };
            let scale = 1.0 / (d as f32).sqrt();
            let ws = AttentionWorkspace::for_shapes(client, 1, hq, hkv, d, max_len);
            let tables_h = (&cos_h[..], &sin_h[..]);
            let old_h = (&k_old_h[..], &v_old_h[..]);
            let (want, wk) =
                reference_block(&qkv_h, (hq, hkv, d), tables_h, pos, Some(ref_norm), old_h);
            let q = poisoned(client, &[1, hq, d], dtype);
            let out = poisoned(client, &[1, hq, d], dtype);
            rope_attention_decode_into(
                client,
                &qkv,
                heads,
                &cos,
                &sin,
                &start,
                &kc,
                &vc,
                Some(norm),
                KvLen::Appended(&end),
                scale,
                &q,
                &out,
                Some(&ws),
            )
            .unwrap();
            let what = format!("{dtype} {hq}/{hkv}x{d} @{pos} of {max_len} q/k norm");
            let got = out.to_f64_vec(client).unwrap();
            assert_close_norm(&what, &got, &want, attn_tol(dtype));
            let k_new = kc.to_f64_vec(client).unwrap();
            assert_close(
                &format!("{what} appended key"),
                &k_new[pos * row..len * row],
                &wk,
                tolerance(dtype),
            );
        }
    }
}

#[test]
fn rope_attention_decode_matches_reference_and_the_two_launches() {
    on_each_runtime!(rope_decode_case);
}

#[test]
fn rope_attention_decode_with_qk_norms_matches_reference() {
    on_each_runtime!(rope_decode_qk_norm_case);
}
