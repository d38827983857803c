use cubecl::prelude::*;
use ops::embedding::{embedding, embedding_into};
use ops::reference::elementwise as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

fn embedding_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(31);
    for dtype in float_dtypes(client) {
        for &(vocab, hidden) in &[(1usize, 1usize), (17, 33), (1000, 127), (257, 1536)] {
            let (table, th) = upload(
                client,
                &random(&mut rng, vocab * hidden, 1.0),
                &[vocab, hidden],
                dtype,
            );
            // In-range ids, the last row, and out-of-range ones that clamp to the last row.
            let ids: Vec<i64> = vec![
                0,
                (vocab - 1) as i64,
                (vocab / 2) as i64,
                vocab as i64,
                1 << 20,
            ];
            let ids_u: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
            let t = DeviceTensor::from_slice(client, &ids_u, &[ids.len()]).unwrap();
            let out = poisoned(client, &[ids.len(), hidden], dtype);
            embedding_into(client, &table, &t, &out).unwrap();
            let want = reference::embedding(&th, hidden, &ids);
            assert_close(
                &format!("embedding {dtype} {vocab}x{hidden}"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                0.0,
            );
            // i32 ids, including a negative one (clamped to the last row too).
            let ids_i: Vec<i32> = vec![(vocab - 1) as i32, -3, 0];
            let t = DeviceTensor::from_slice(client, &ids_i, &[3]).unwrap();
            let out = poisoned(client, &[3, hidden], dtype);
            embedding_into(client, &table, &t, &out).unwrap();
            let want = reference::embedding(&th, hidden, &[(vocab - 1) as i64, -3, 0]);
            assert_close(
                &format!("embedding i32 {dtype} {vocab}x{hidden}"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                0.0,
            );
        }
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let table = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let ids = DeviceTensor::from_slice(client, &[0u32, 1], &[2]).unwrap();
    let fids = DeviceTensor::from_f32(client, &[0.0, 1.0], &[2], DType::F32).unwrap();
    let ids2d = DeviceTensor::from_slice(client, &[0u32, 1], &[1, 2]).unwrap();
    assert_err("float ids", embedding(client, &table, &fids), "dtype");
    assert_err("2-D ids", embedding(client, &table, &ids2d), "shape");
    assert_err("1-D table", embedding(client, &ids, &ids), "dtype");
    let flat = DeviceTensor::from_f32(client, &[1.0; 12], &[12], DType::F32).unwrap();
    assert_err("1-D float table", embedding(client, &flat, &ids), "shape");
    let out = DeviceTensor::empty(client, &[2, 3], DType::F32);
    assert_err(
        "out shape",
        embedding_into(client, &table, &ids, &out),
        "shape",
    );
}

#[test]
fn embedding_matches_reference() {
    on_each_runtime!(embedding_case);
}

#[test]
fn embedding_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
