//! The BSR format: the work list, pruning, the dense and raw constructors and their validation.

use cubecl::prelude::*;
use ops::DType;
use sparse::{reference, validate_bsr, Bsr, SparseError};
use testkit::*;

use super::random_mask;

/// The work list covers every block exactly once, every block-row at least once.
#[test]
fn work_list_covers_every_block() {
    let mut rng = rng(75);
    for density in [0.0, 0.05, 0.5, 1.0] {
        for rows in [1usize, 7, 64] {
            let cols = 40;
            let mut mask = random_mask(&mut rng, rows, cols, density);
            if rows > 1 {
                mask[..cols].fill(true);
            }
            let mut crow = vec![0i32];
            for r in 0..rows {
                let n = mask[r * cols..(r + 1) * cols]
                    .iter()
                    .filter(|&&m| m)
                    .count();
                crow.push(crow[r] + n as i32);
            }
            let work = sparse::bsr::build_work_items(&crow);
            let nnz = *crow.last().unwrap() as usize;
            let mut seen = vec![0u32; nnz];
            let mut row_seen = vec![false; rows];
            for it in &work.items {
                let r = it[0] as usize;
                row_seen[r] = true;
                assert!(
                    crow[r] <= it[1] && it[1] <= it[2] && it[2] <= crow[r + 1],
                    "{it:?}"
                );
                for blk in it[1]..it[2] {
                    seen[blk as usize] += 1;
                }
                if it[3] >= 0 {
                    let s = work
                        .splits
                        .iter()
                        .find(|s| s[0] == it[0])
                        .expect("a slot item belongs to a cut row");
                    assert!(s[1] <= it[3] && it[3] < s[1] + s[2], "{it:?} {s:?}");
                }
            }
            assert!(
                seen.iter().all(|&c| c == 1),
                "density {density} rows {rows}"
            );
            assert!(row_seen.iter().all(|&r| r));
            let lens: Vec<i32> = work.items.iter().map(|it| it[2] - it[1]).collect();
            assert!(lens.windows(2).all(|w| w[0] >= w[1]), "longest first");
        }
    }
}

fn prune_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(78);
    let (b, shape) = (16, [64, 128]);
    let dense = random(&mut rng, 64 * 128, 1.0);
    let cols = shape[1] / b;
    let norm = |br: usize, bc: usize| -> f64 {
        let mut s = 0.0;
        for i in 0..b {
            for j in 0..b {
                let v = dense[(br * b + i) * shape[1] + bc * b + j] as f64;
                s += v * v;
            }
        }
        s
    };
    for sparsity in [0.0, 0.3, 0.7, 0.9, 1.0] {
        let w = Bsr::prune_from_dense(client, &dense, shape, b, sparsity, DType::F32).unwrap();
        let total = 4 * cols;
        let kept = ((1.0 - sparsity) * total as f64).round() as usize;
        assert_eq!(w.nnz_blocks(), kept, "sparsity {sparsity}");
        assert!((w.density() - kept as f64 / total as f64).abs() < 1e-12);
        // Every kept block has a norm >= every dropped block.
        let crow = w.crow_indices_host();
        let col = w.col_indices_host();
        let mut kept_mask = vec![false; total];
        for br in 0..4 {
            for idx in crow[br]..crow[br + 1] {
                kept_mask[br * cols + col[idx as usize] as usize] = true;
            }
        }
        let min_kept = (0..total)
            .filter(|&i| kept_mask[i])
            .map(|i| norm(i / cols, i % cols))
            .fold(f64::INFINITY, f64::min);
        let max_dropped = (0..total)
            .filter(|&i| !kept_mask[i])
            .map(|i| norm(i / cols, i % cols))
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(min_kept >= max_dropped, "sparsity {sparsity}");
        // Kept blocks hold the dense values; dropped ones are zero.
        let back = w.to_dense(client).unwrap();
        for (i, (&got, &d)) in back.iter().zip(&dense).enumerate() {
            let blk = (i / shape[1] / b) * cols + (i % shape[1]) / b;
            assert_eq!(got, if kept_mask[blk] { d } else { 0.0 });
        }
    }
    // Ties: all blocks of equal norm keep the earliest blocks in row-major block order.
    let ones = vec![1.0f32; 64 * 128];
    let w = Bsr::prune_from_dense(client, &ones, shape, b, 0.75, DType::F32).unwrap();
    assert_eq!(w.crow_indices_host(), [0, 8, 8, 8, 8]);
    assert_eq!(w.col_indices_host(), [0, 1, 2, 3, 4, 5, 6, 7]);
    for bad in [-0.1, 1.5, f64::NAN] {
        assert!(matches!(
            Bsr::prune_from_dense(client, &dense, shape, b, bad, DType::F32),
            Err(SparseError::Sparsity { .. })
        ));
    }
}

fn from_dense_case<R: Runtime>(client: &ComputeClient<R>) {
    // Blocks (0,1) and (1,0) of a [4, 4] matrix with b = 2; block (1,1) is present but holds
    // one zero, block (0,0) is all zero and dropped.
    #[rustfmt::skip]
    let dense = [
        0.0, 0.0, 1.0, 2.0,
        0.0, 0.0, 3.0, 4.0,
        5.0, 6.0, 0.0, 7.0,
        8.0, 9.0, 0.0, 0.0,
    ];
    let w = Bsr::from_dense(client, &dense, [4, 4], 2, DType::F32).unwrap();
    assert_eq!(w.crow_indices_host(), [0, 1, 3]);
    assert_eq!(w.col_indices_host(), [1, 0, 1]);
    assert_eq!(w.nnz_blocks(), 3);
    assert_eq!(w.density(), 0.75);
    assert_eq!(
        w.values().to_vec::<f32>(client).unwrap(),
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 9.0, 0.0, 7.0, 0.0, 0.0]
    );
    assert_eq!(
        w.crow_indices().to_vec::<i32>(client).unwrap(),
        w.crow_indices_host()
    );
    assert_eq!(
        w.col_indices().to_vec::<i32>(client).unwrap(),
        w.col_indices_host()
    );
    assert_eq!(w.to_dense(client).unwrap(), dense);
    // Raw arrays round-trip, and agree with the independent reference.
    let values: Vec<f32> = (0..3 * 4).map(|i| i as f32 - 5.0).collect();
    let raw = Bsr::from_raw(
        client,
        &[0, 1, 3],
        &[1, 0, 1],
        &values,
        [4, 4],
        2,
        DType::F32,
    )
    .unwrap();
    let want = reference::bsr_to_dense(
        &[0, 1, 3],
        &[1, 0, 1],
        &values.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        [4, 4],
        2,
    );
    let got: Vec<f64> = raw
        .to_dense(client)
        .unwrap()
        .into_iter()
        .map(|v| v as f64)
        .collect();
    assert_eq!(got, want);
    // An all-zero matrix has no blocks and multiplies to zeros (or the bias).
    let zero = Bsr::from_dense(client, &[0.0; 16], [4, 4], 2, DType::F32).unwrap();
    assert_eq!(zero.nnz_blocks(), 0);
    assert_eq!(zero.to_dense(client).unwrap(), [0.0; 16]);
}

fn validation_case<R: Runtime>(client: &ComputeClient<R>) {
    let f = DType::F32;
    let v = |nnz: usize| vec![1.0f32; nnz * 4];
    // A valid [4, 6] matrix with b = 2: 2 block-rows, 3 block columns.
    assert!(Bsr::from_raw(client, &[0, 2, 3], &[0, 2, 1], &v(3), [4, 6], 2, f).is_ok());
    let err = |crow: &[i32], col: &[i32], values: &[f32], shape: [usize; 2], b: usize| {
        let e = Bsr::from_raw(client, crow, col, values, shape, b, f).unwrap_err();
        // The pure validator agrees with the constructor.
        assert_eq!(
            validate_bsr(crow, col, values.len(), shape, b).unwrap_err(),
            e
        );
        e
    };
    assert!(matches!(
        err(&[0, 2, 3], &[0, 2, 1], &v(3), [4, 6], 0),
        SparseError::BlockSize { .. }
    ));
    assert!(matches!(
        err(&[0, 2, 3], &[0, 2, 1], &v(3), [4, 5], 2),
        SparseError::ShapeNotMultiple { .. }
    ));
    assert!(matches!(
        err(&[0, 2, 3], &[0, 2, 1], &v(3), [0, 6], 2),
        SparseError::ShapeNotMultiple { .. }
    ));
    assert!(matches!(
        err(&[0, 3], &[0, 2, 1], &v(3), [4, 6], 2),
        SparseError::CrowLength {
            len: 2,
            expected: 3
        }
    ));
    assert!(matches!(
        err(&[1, 2, 3], &[0, 2, 1], &v(3), [4, 6], 2),
        SparseError::CrowStart { first: 1 }
    ));
    assert!(matches!(
        err(&[0, 2, 1], &[0, 2, 1], &v(3), [4, 6], 2),
        SparseError::CrowNotMonotone { row: 1, .. }
    ));
    assert!(matches!(
        err(&[0, 2, 2], &[0, 2, 1], &v(3), [4, 6], 2),
        SparseError::CrowEnd { last: 2, nnz: 3 }
    ));
    assert!(matches!(
        err(&[0, 2, 3], &[0, 3, 1], &v(3), [4, 6], 2),
        SparseError::ColOutOfRange {
            index: 1,
            col: 3,
            ..
        }
    ));
    assert!(matches!(
        err(&[0, 2, 3], &[0, -1, 1], &v(3), [4, 6], 2),
        SparseError::ColOutOfRange { index: 1, .. }
    ));
    assert!(matches!(
        err(&[0, 2, 3], &[2, 0, 1], &v(3), [4, 6], 2),
        SparseError::ColUnsorted { row: 0, .. }
    ));
    assert!(matches!(
        err(&[0, 2, 3], &[1, 1, 1], &v(3), [4, 6], 2),
        SparseError::ColDuplicate { row: 0, col: 1 }
    ));
    assert!(matches!(
        err(&[0, 2, 3], &[0, 2, 1], &v(2), [4, 6], 2),
        SparseError::ValuesLength {
            len: 8,
            expected: 12
        }
    ));
    // Unsorted across rows is fine: only within a row must columns increase.
    assert!(Bsr::from_raw(client, &[0, 1, 2], &[2, 0], &v(2), [4, 6], 2, f).is_ok());
    // Dense constructors check their shapes too.
    assert!(matches!(
        Bsr::from_dense(client, &[1.0; 30], [5, 6], 2, f),
        Err(SparseError::ShapeNotMultiple { .. })
    ));
    assert!(matches!(
        Bsr::from_dense(client, &[1.0; 23], [4, 6], 2, f),
        Err(SparseError::DenseLength { .. })
    ));
    // A SparseError converts to the OpsError the ops speak.
    let e: ops::OpsError = SparseError::ColDuplicate { row: 0, col: 1 }.into();
    assert_eq!(e.kind(), "argument");
    if !ops::caps::supports_dtype(client, DType::BF16) {
        assert!(matches!(
            Bsr::from_dense(client, &[1.0; 16], [4, 4], 2, DType::BF16),
            Err(SparseError::Ops(ops::OpsError::UnsupportedDType { .. }))
        ));
    }
}

#[test]
fn bsr_prune_keeps_largest_blocks() {
    on_each_runtime!(prune_case);
}

#[test]
fn bsr_from_dense_and_raw_round_trip() {
    on_each_runtime!(from_dense_case);
}

#[test]
fn bsr_from_raw_rejects_each_violation() {
    on_each_runtime!(validation_case);
}
