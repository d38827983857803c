//! Decode attention over a ragged batch (`attention_decode_ragged_into`): each row against the
//! f64 reference over its own slot and length, and bit for bit equal to the one-sequence
//! cached path run on that sequence alone (what continuous batching relies on for a request's
//! output not to depend on what it is batched with).

use super::*;
use ops::attention::{
    attention_cached_into, attention_decode_ragged_into, AttentionWorkspace, KvLen,
};
use ops::DeviceTensor;

/// (Hq, Hkv, D): grouped, ungrouped and a small odd head count.
const HEADS: [(usize, usize, usize); 3] = [(12, 2, 128), (6, 2, 64), (3, 3, 16)];

fn ragged_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(77);
    let (slots, max_len) = (4usize, 300usize);
    // (position, slot): short and long, the last position, a repeated slot, and a position
    // past the cache (clamped to the last row).
    let rows: [(usize, usize); 5] = [(123, 2), (0, 0), (299, 3), (40, 2), (5000, 1)];
    for dtype in float_dtypes(client) {
        for &(hq, hkv, d) in &HEADS {
            let row = hkv * d;
            let kc_h = exact_values(&mut rng, slots * max_len * row);
            let vc_h = exact_values(&mut rng, slots * max_len * row);
            let b = rows.len();
            let q_h = exact_values(&mut rng, b * hq * d);
            let (q, _) = upload(client, &q_h, &[b, hq, d], dtype);
            let (kc, _) = upload(client, &kc_h, &[slots, max_len, hkv, d], dtype);
            let (vc, _) = upload(client, &vc_h, &[slots, max_len, hkv, d], dtype);
            let table: Vec<u32> = rows
                .iter()
                .flat_map(|&(p, s)| [p as u32, s as u32])
                .collect();
            let seqs = DeviceTensor::from_slice(client, &table, &[b, 2]).unwrap();
            let ws = AttentionWorkspace::for_shapes(client, b, hq, hkv, d, max_len);
            let out = poisoned(client, &[b, hq, d], dtype);
            let scale = 1.0 / (d as f32).sqrt();
            attention_decode_ragged_into(client, &q, &kc, &vc, &seqs, scale, &out, Some(&ws))
                .unwrap();
            let got = out.to_f64_vec(client).unwrap();
            let f = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<_>>();
            let one_ws = AttentionWorkspace::for_shapes(client, 1, hq, hkv, d, max_len);
            for (i, &(pos, slot)) in rows.iter().enumerate() {
                let len = (pos + 1).min(max_len);
                let base = slot * max_len * row;
                let want = reference::attention::attention(
                    &f(&q_h[i * hq * d..(i + 1) * hq * d]),
                    &f(&kc_h[base..base + len * row]),
                    &f(&vc_h[base..base + len * row]),
                    1,
                    len,
                    hq,
                    hkv,
                    d,
                    scale as f64,
                    true,
                );
                let what =
                    format!("ragged {dtype} {hq}/{hkv}x{d} row {i} (pos {pos}, slot {slot})");
                let got_row = &got[i * hq * d..(i + 1) * hq * d];
                assert_close(&what, got_row, &want, attn_tol(dtype));

                // The same sequence alone, through the one-sequence cached path.
                let (q1, _) = upload(
                    client,
                    &q_h[i * hq * d..(i + 1) * hq * d],
                    &[1, hq, d],
                    dtype,
                );
                let slot_rows = max_len * row;
                let (k1, _) = upload(
                    client,
                    &kc_h[base..base + slot_rows],
                    &[max_len, hkv, d],
                    dtype,
                );
                let (v1, _) = upload(
                    client,
                    &vc_h[base..base + slot_rows],
                    &[max_len, hkv, d],
                    dtype,
                );
                let dev_len = DeviceTensor::from_slice(client, &[len as u32], &[1]).unwrap();
                let alone = poisoned(client, &[1, hq, d], dtype);
                attention_cached_into(
                    client,
                    &q1,
                    &k1,
                    &v1,
                    KvLen::Device(&dev_len),
                    scale,
                    &alone,
                    Some(&one_ws),
                )
                .unwrap();
                let alone = alone.to_f64_vec(client).unwrap();
                assert!(
                    alone
                        .iter()
                        .zip(got_row)
                        .all(|(a, g)| a.to_bits() == g.to_bits()),
                    "{what}: differs from the sequence run alone"
                );
            }
        }
    }
}

fn ragged_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let dtype = DType::F32;
    let (hq, hkv, d, slots, max_len) = (4, 2, 16, 3, 8);
    let q = poisoned(client, &[2, hq, d], dtype);
    let kc = poisoned(client, &[slots, max_len, hkv, d], dtype);
    let out = poisoned(client, &[2, hq, d], dtype);
    let seqs = DeviceTensor::from_slice(client, &[0u32, 0, 1, 1], &[2, 2]).unwrap();
    let run = |q: &DeviceTensor<R>, k: &DeviceTensor<R>, seqs: &DeviceTensor<R>| {
        attention_decode_ragged_into(client, q, k, k, seqs, 0.5, &out, None)
    };
    run(&q, &kc, &seqs).unwrap();
    let flat = poisoned(client, &[slots * max_len, hkv, d], dtype);
    assert_err("cache of rank 3", run(&q, &flat, &seqs), "shape");
    let short = DeviceTensor::from_slice(client, &[0u32, 0], &[1, 2]).unwrap();
    assert_err(
        "one row of seqs for two queries",
        run(&q, &kc, &short),
        "shape",
    );
    let wide = DeviceTensor::from_slice(client, &[0u32; 6], &[2, 3]).unwrap();
    assert_err("seqs of width 3", run(&q, &kc, &wide), "shape");
    let q4 = poisoned(client, &[2, 1, hq, d], dtype);
    assert_err("q of rank 4", run(&q4, &kc, &seqs), "shape");
    let other_d = poisoned(client, &[slots, max_len, hkv, 32], dtype);
    assert_err("head dim mismatch", run(&q, &other_d, &seqs), "shape");
}

#[test]
fn ragged_decode_matches_reference_and_the_sequence_alone() {
    on_each_runtime!(ragged_case);
}

#[test]
fn ragged_decode_rejects_bad_inputs() {
    on_each_runtime!(ragged_errors_case);
}
