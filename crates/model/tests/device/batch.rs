//! Continuous batching's device side: a `BatchSession` decoding several sequences of different
//! lengths together, joining and leaving between steps, gives each one the tokens and the logits
//! (bit for bit) it gets when it is the only sequence in the batch: a request's text does not
//! depend on what it is batched with. (A single-stream `Session` may round differently: it runs
//! one row on the kernels fastest for one row.)

use cubecl::prelude::*;
use model::{BatchLm, BatchSession, LoadOptions, ModelError};
use ops::{caps, DType};
use testkit::on_each_runtime_one_cuda_at_a_time;

use crate::{load, Demo};

const STEPS: usize = 10;

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 80, 300, 17, 999, 42],
        (0..29).map(|i| (i * 37 % 500) as u32 + 3).collect(),
        vec![11],
        (0..13).map(|i| (i * 101 % 700) as u32 + 1).collect(),
    ]
}

fn options(dtype: DType) -> LoadOptions {
    LoadOptions {
        dtype: Some(dtype),
        max_len: Some(64),
        ..LoadOptions::default()
    }
}

/// `steps` greedy tokens of `prompt` decoded alone (the only sequence of `s`, in slot 0), with
/// each step's logits.
fn alone<R: Runtime>(
    s: &mut BatchSession<R>,
    prompt: &[u32],
    steps: usize,
) -> Vec<(u32, Vec<f32>)> {
    let mut logits = Vec::new();
    s.prefill(0, prompt).unwrap();
    s.prefill_logits(&mut logits).unwrap();
    let mut t = s.prefill_argmax().unwrap();
    let mut out = vec![(t, logits.clone())];
    while out.len() < steps {
        s.decode(&[(0, t)]).unwrap();
        t = s.decode_argmax().unwrap()[0];
        s.decode_logits(&mut logits).unwrap();
        out.push((t, logits.clone()));
    }
    s.release(0);
    out
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn batch_case<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let cuda = caps::runtime_name(client) == "cuda";
    let mut dtypes = vec![DType::F32];
    if cuda {
        dtypes.push(DType::BF16);
    }
    for dtype in dtypes {
        let (m, _) = load(client, &demo.0, &options(dtype)).unwrap();
        let vocab = m.config().vocab_size;
        let mut single = BatchSession::new(m, 1, true).unwrap();
        let want: Vec<_> = prompts()
            .iter()
            .map(|p| alone(&mut single, p, STEPS))
            .collect();

        let (m, _) = load(client, &demo.0, &options(dtype)).unwrap();
        let mut batch = BatchSession::new(m, 3, true).unwrap();
        assert_eq!(batch.max_batch(), 3);
        // Sequence i joins at step `join[i]` in slot `slot[i]` (sequence 3 reuses the slot
        // sequence 2 leaves), and each runs STEPS tokens.
        let join = [0usize, 2, 3, 3 + STEPS];
        let slot = [1usize, 0, 2, 2];
        let mut got: Vec<Vec<(u32, Vec<f32>)>> = vec![Vec::new(); 4];
        let mut next = [0u32; 4];
        let mut logits = Vec::new();
        let mut rows_seen = std::collections::BTreeSet::new();
        for step in 0..(join[3] + STEPS) {
            for i in 0..4 {
                if join[i] == step {
                    if i == 3 {
                        batch.release(slot[2]);
                    }
                    batch.prefill(slot[i], &prompts()[i]).unwrap();
                    batch.prefill_logits(&mut logits).unwrap();
                    let t = batch.prefill_argmax().unwrap();
                    got[i].push((t, logits.clone()));
                    next[i] = t;
                }
            }
            let active: Vec<usize> = (0..4)
                .filter(|&i| join[i] <= step && got[i].len() < STEPS)
                .collect();
            if active.is_empty() {
                continue;
            }
            let rows: Vec<(usize, u32)> = active.iter().map(|&i| (slot[i], next[i])).collect();
            rows_seen.insert(rows.len());
            batch.decode(&rows).unwrap();
            let ids = batch.decode_argmax().unwrap();
            batch.decode_logits(&mut logits).unwrap();
            assert_eq!(ids.len(), rows.len());
            assert_eq!(logits.len(), rows.len() * vocab);
            for (r, &i) in active.iter().enumerate() {
                got[i].push((ids[r], logits[r * vocab..(r + 1) * vocab].to_vec()));
                next[i] = ids[r];
            }
        }
        assert!(
            rows_seen.contains(&3) && rows_seen.contains(&1),
            "{rows_seen:?}"
        );
        for i in 0..4 {
            for (s, ((gt, gl), (wt, wl))) in got[i].iter().zip(&want[i]).enumerate() {
                assert_eq!(gt, wt, "{dtype} sequence {i} step {s}: token");
                assert!(
                    same_bits(gl, wl),
                    "{dtype} sequence {i} step {s}: logits differ from the sequence alone"
                );
            }
        }
        if cuda {
            assert!(
                batch.uses_graph(3) && batch.uses_graph(1),
                "graphs replayed"
            );
        }
    }
}

#[test]
fn batched_sequences_decode_as_they_would_alone() {
    on_each_runtime_one_cuda_at_a_time!(batch_case);
}

/// The largest batch the server runs, 16 sequences (every product at its last GEMV row count),
/// each slot's tokens and logits bit for bit those of the sequence alone.
fn full_batch_case<R: Runtime>(client: &ComputeClient<R>) {
    const ROWS: usize = 16;
    const FULL_STEPS: usize = 4;
    let demo = Demo::new();
    let prompts: Vec<Vec<u32>> = (0..ROWS)
        .map(|i| {
            (0..1 + 3 * i)
                .map(|j| ((i * 131 + j * 29) % 900) as u32 + 2)
                .collect()
        })
        .collect();
    let (m, _) = load(client, &demo.0, &options(DType::F32)).unwrap();
    let vocab = m.config().vocab_size;
    let mut single = BatchSession::new(m, 1, true).unwrap();
    let want: Vec<_> = prompts
        .iter()
        .map(|p| alone(&mut single, p, FULL_STEPS))
        .collect();
    let (m, _) = load(client, &demo.0, &options(DType::F32)).unwrap();
    let mut batch = BatchSession::new(m, ROWS, true).unwrap();
    let mut logits = Vec::new();
    let mut got: Vec<Vec<(u32, Vec<f32>)>> = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        batch.prefill(i, p).unwrap();
        batch.prefill_logits(&mut logits).unwrap();
        got.push(vec![(batch.prefill_argmax().unwrap(), logits.clone())]);
    }
    while got[0].len() < FULL_STEPS {
        let rows: Vec<(usize, u32)> = got.iter().map(|g| g[g.len() - 1].0).enumerate().collect();
        batch.decode(&rows).unwrap();
        let ids = batch.decode_argmax().unwrap();
        batch.decode_logits(&mut logits).unwrap();
        assert_eq!(logits.len(), ROWS * vocab);
        for ((g, &id), row) in got.iter_mut().zip(&ids).zip(logits.chunks(vocab)) {
            g.push((id, row.to_vec()));
        }
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (step, ((gt, gl), (wt, wl))) in g.iter().zip(w).enumerate() {
            assert_eq!(gt, wt, "sequence {i} step {step}: token");
            assert!(
                same_bits(gl, wl),
                "sequence {i} step {step}: logits differ from the sequence alone"
            );
        }
    }
}

#[test]
fn a_full_batch_decodes_as_each_sequence_alone() {
    on_each_runtime_one_cuda_at_a_time!(full_batch_case);
}

/// Bad calls are errors, not wrong answers: a slot out of range, a slot twice in one step, too
/// many rows, a token outside the vocabulary, a full slot, reading before any step.
fn batch_errors<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let (m, _) = load(client, &demo.0, &options(DType::F32)).unwrap();
    let vocab = m.config().vocab_size as u32;
    assert!(BatchSession::new(m, 17, false).is_err());
    let (m, _) = load(client, &demo.0, &options(DType::F32)).unwrap();
    let mut b = BatchSession::new(m, 2, false).unwrap();
    let param = |r: Result<(), ModelError>| {
        assert!(
            matches!(r, Err(ModelError::InvalidParameter { .. })),
            "{r:?}"
        )
    };
    assert!(b.decode_argmax().is_err());
    assert!(b.prefill_argmax().is_err());
    param(b.prefill(2, &[1, 2]));
    b.prefill(0, &[1, 2, 3]).unwrap();
    b.prefill(1, &[4]).unwrap();
    param(b.decode(&[]));
    param(b.decode(&[(0, 1), (0, 2)]));
    param(b.decode(&[(0, 1), (1, 2), (1, 3)]));
    param(b.decode(&[(2, 1)]));
    param(b.decode(&[(0, vocab)]));
    let long: Vec<u32> = (0..64).map(|i| i % 50 + 1).collect();
    b.prefill(1, &long).unwrap();
    assert!(matches!(
        b.decode(&[(1, 3)]),
        Err(ModelError::ContextOverflow { .. })
    ));
    assert_eq!(b.slot_len(0), 3);
    b.decode(&[(0, 7)]).unwrap();
    assert_eq!(b.slot_len(0), 4);
    b.release(0);
    assert_eq!(b.slot_len(0), 0);
}

#[test]
fn batch_session_rejects_bad_calls() {
    on_each_runtime_one_cuda_at_a_time!(batch_errors);
}
