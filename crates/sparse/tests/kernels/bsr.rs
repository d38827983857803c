//! BSR construction and the dense x block-sparse matmul against dense f64 references.

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, LinearWorkspace};
use ops::{DType, DeviceTensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use sparse::{
    bsr_linear, bsr_linear_into, bsr_linear_into_tuned, reference, validate_bsr, Bsr, SparseError,
    SparseLinear, Tuning,
};
use testkit::*;

/// A block mask with exactly `round(density * blocks)` blocks present, at random places.
fn random_mask(rng: &mut StdRng, rows: usize, cols: usize, density: f64) -> Vec<bool> {
    let total = rows * cols;
    let keep = ((density * total as f64).round() as usize).min(total);
    let mut mask: Vec<bool> = (0..total).map(|i| i < keep).collect();
    mask.shuffle(rng);
    mask
}

/// A dense `[n, k]` matrix whose present blocks hold random values in [-1, 1] (never all zero)
/// and whose absent blocks are zero.
fn blocky(rng: &mut StdRng, shape: [usize; 2], b: usize, mask: &[bool]) -> Vec<f32> {
    let cols = shape[1] / b;
    let vals = random(rng, shape[0] * shape[1], 1.0);
    let mut dense = vec![0f32; shape[0] * shape[1]];
    for n in 0..shape[0] {
        for k in 0..shape[1] {
            if mask[(n / b) * cols + k / b] {
                dense[n * shape[1] + k] = if vals[n * shape[1] + k] == 0.0 {
                    0.5
                } else {
                    vals[n * shape[1] + k]
                };
            }
        }
    }
    dense
}

/// Runs `bsr_linear_into` on a NaN-poisoned output and compares with the dense reference.
#[allow(clippy::too_many_arguments)]
fn check_linear<R: Runtime>(
    client: &ComputeClient<R>,
    what: &str,
    rng: &mut StdRng,
    dense: &[f32],
    shape: [usize; 2],
    b: usize,
    m: usize,
    dtype: DType,
    with_bias: bool,
    tuning: Tuning,
) {
    let [n, k] = shape;
    let w = Bsr::from_dense(client, dense, shape, b, dtype).unwrap();
    let wh = round_to(dense, dtype);
    // The device copy of the weight is exactly the rounded dense matrix.
    let back: Vec<f64> = w
        .to_dense(client)
        .unwrap()
        .into_iter()
        .map(|v| v as f64)
        .collect();
    assert_eq!(back, wh, "{what}: to_dense");
    let (x, xh) = upload(client, &random(rng, m * k, 1.0), &[m, k], dtype);
    let (bias, bh) = if with_bias {
        let (t, h) = upload(client, &random(rng, n, 1.0), &[n], dtype);
        (Some(t), Some(h))
    } else {
        (None, None)
    };
    let out = poisoned(client, &[m, n], dtype);
    bsr_linear_into_tuned(client, &x, &w, bias.as_ref(), &out, tuning).unwrap();
    let want = reference::linear(&xh, &wh, bh.as_deref(), m, k, n);
    assert_close(
        &format!("{what} {dtype} m={m} shape={shape:?} b={b} bias={with_bias} {tuning:?}"),
        &out.to_f64_vec(client).unwrap(),
        &want,
        tolerance(dtype),
    );
}

fn densities_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(70);
    let (b, shape) = (32, [256, 256]);
    for dtype in float_dtypes(client) {
        for (i, &density) in [0.0, 0.05, 0.5, 0.9, 1.0].iter().enumerate() {
            let mask = random_mask(&mut rng, shape[0] / b, shape[1] / b, density);
            let dense = blocky(&mut rng, shape, b, &mask);
            for (j, m) in [1usize, 17, 128].into_iter().enumerate() {
                let what = format!("density {density}");
                let bias = (i + j) % 2 == 1;
                check_linear(
                    client,
                    &what,
                    &mut rng,
                    &dense,
                    shape,
                    b,
                    m,
                    dtype,
                    bias,
                    Tuning::default(),
                );
            }
        }
    }
}

fn block_sizes_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(71);
    for dtype in float_dtypes(client) {
        for (b, shape) in [(16, [128, 192]), (32, [96, 160]), (64, [256, 192])] {
            let mask = random_mask(&mut rng, shape[0] / b, shape[1] / b, 0.5);
            let dense = blocky(&mut rng, shape, b, &mask);
            for m in [1usize, 17, 128] {
                check_linear(
                    client,
                    "block size",
                    &mut rng,
                    &dense,
                    shape,
                    b,
                    m,
                    dtype,
                    m != 17,
                    Tuning::default(),
                );
            }
        }
    }
}

fn large_m_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(72);
    // Lavapipe runs the portable kernel on the CPU: keep its weight small there.
    let cuda = ops::caps::runtime_name(client).contains("cuda");
    let (b, shape) = if cuda {
        (32, [256, 512])
    } else {
        (16, [64, 96])
    };
    let mask = random_mask(&mut rng, shape[0] / b, shape[1] / b, 0.5);
    let dense = blocky(&mut rng, shape, b, &mask);
    for dtype in float_dtypes(client) {
        check_linear(
            client,
            "M=1024",
            &mut rng,
            &dense,
            shape,
            b,
            1024,
            dtype,
            true,
            Tuning::default(),
        );
    }
}

/// Every launch shape the kernels can take, forced through [`Tuning`] (the default picks only
/// some of them for small test matrices).
fn tile_shapes_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(73);
    // (block, tile_m, k_groups, group_blocks, double_buffer, cp.async stages; 0 = registers)
    type Shape = (usize, usize, Option<usize>, Option<usize>, bool, usize);
    let mut shapes: Vec<Shape> = if sparse::linear::uses_tensor_cores(client, DType::F16) {
        vec![
            (32, 16, Some(1), None, true, 0),
            (32, 16, Some(4), Some(2), true, 0),
            (32, 16, Some(8), Some(4), false, 0),
            (32, 32, Some(1), Some(3), true, 0),
            (32, 32, Some(2), None, false, 0),
            (32, 32, Some(4), None, true, 0),
            (32, 64, Some(1), Some(4), false, 0),
            (32, 64, Some(2), Some(2), true, 0),
            (32, 64, Some(2), None, true, 0),
            (32, 128, Some(1), Some(2), true, 0),
            (32, 128, Some(2), None, false, 0),
            (16, 16, Some(8), Some(2), true, 0),
            (16, 128, Some(1), Some(4), false, 0),
            (64, 16, Some(2), None, true, 0),
            (64, 64, Some(1), Some(2), false, 0),
            (64, 128, Some(1), None, true, 0),
        ]
    } else {
        vec![
            (32, 16, None, None, true, 0),
            (32, 32, None, None, false, 0),
            (32, 64, None, None, false, 0),
            (16, 64, None, None, true, 0),
            (64, 16, None, None, false, 0),
        ]
    };
    if sparse::linear::uses_tensor_cores(client, DType::F16) && client.features().copy_async {
        shapes.extend([
            (32, 16, Some(1), None, true, 2),
            (32, 16, Some(8), Some(2), true, 3),
            (32, 32, Some(2), Some(3), true, 4),
            (32, 64, Some(2), None, true, 3),
            (32, 64, Some(1), Some(2), true, 4),
            (32, 128, Some(1), None, true, 3),
            (16, 16, Some(4), Some(2), true, 2),
            (16, 128, Some(1), Some(4), true, 3),
            (64, 16, Some(2), None, true, 3),
            (64, 64, Some(1), Some(2), true, 2),
            (64, 128, Some(1), None, true, 4),
        ]);
    }
    let dtypes: Vec<DType> = float_dtypes(client)
        .into_iter()
        .filter(|&d| d != DType::F32 || !sparse::linear::uses_tensor_cores(client, DType::F16))
        .collect();
    for &(b, tile_m, k_groups, group_blocks, double_buffer, stages) in &shapes {
        let shape = [4 * b, 6 * b];
        let mask = random_mask(&mut rng, 4, 6, 0.6);
        let dense = blocky(&mut rng, shape, b, &mask);
        for &dtype in &dtypes {
            for m in [5usize, 150] {
                check_linear(
                    client,
                    "tile shape",
                    &mut rng,
                    &dense,
                    shape,
                    b,
                    m,
                    dtype,
                    m == 150,
                    Tuning {
                        tile_m: Some(tile_m),
                        k_groups,
                        group_blocks,
                        double_buffer: Some(double_buffer),
                        stages: Some(stages),
                    },
                );
            }
        }
    }
}

/// Empty block-rows, and one full block-row while every other is empty (which the work list
/// cuts along K, so the partial sums and the reduction kernel run).
fn uneven_rows_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(74);
    let (b, shape) = (16, [128, 256]);
    let (rows, cols) = (shape[0] / b, shape[1] / b);
    let mut full_row = vec![false; rows * cols];
    full_row[3 * cols..4 * cols].fill(true);
    let mut some_empty = random_mask(&mut rng, rows, cols, 0.5);
    for r in [0, 2, 5] {
        some_empty[r * cols..(r + 1) * cols].fill(false);
    }
    some_empty[7 * cols + 1] = true;
    for dtype in float_dtypes(client) {
        for (name, mask) in [("single full row", &full_row), ("empty rows", &some_empty)] {
            let dense = blocky(&mut rng, shape, b, mask);
            let w = Bsr::from_dense(client, &dense, shape, b, dtype).unwrap();
            let work = w.work_items();
            if name == "single full row" {
                assert_eq!(work.splits.len(), 1, "the full row must be cut: {work:?}");
                assert!(work.n_slots >= 2, "{work:?}");
            }
            for m in [1usize, 17, 128] {
                for bias in [false, true] {
                    check_linear(
                        client,
                        name,
                        &mut rng,
                        &dense,
                        shape,
                        b,
                        m,
                        dtype,
                        bias,
                        Tuning::default(),
                    );
                }
            }
        }
    }
}

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

fn higher_rank_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(76);
    let (b, shape) = (16, [64, 48]);
    let mask = random_mask(&mut rng, 4, 3, 0.5);
    let dense = blocky(&mut rng, shape, b, &mask);
    let dtype = DType::F32;
    let w = Bsr::from_dense(client, &dense, shape, b, dtype).unwrap();
    let (x, xh) = upload(
        client,
        &random(&mut rng, 2 * 3 * 48, 1.0),
        &[2, 3, 48],
        dtype,
    );
    let y = bsr_linear(client, &x, &w, None).unwrap();
    assert_eq!(y.shape(), [2, 3, 64]);
    let want = reference::linear(&xh, &round_to(&dense, dtype), None, 6, 48, 64);
    assert_close(
        "rank 3",
        &y.to_f64_vec(client).unwrap(),
        &want,
        tolerance(dtype),
    );
}

/// The layer through the `Linear` capability: bias, residual and gated epilogues (the last two
/// run after the kernel, through the workspace or a temporary), against the reference.
fn layer_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(77);
    let shape = [128, 96];
    let dense = random(&mut rng, 128 * 96, 1.0);
    let bias = random(&mut rng, 128, 1.0);
    for dtype in float_dtypes(client) {
        let layer = SparseLinear::prune(client, &dense, shape, 32, 0.5, dtype).unwrap();
        assert_eq!(layer.weight.nnz_blocks(), 6);
        assert_eq!((layer.in_features(), layer.out_rows()), (96, 128));
        let pruned: Vec<f64> = layer
            .weight
            .to_dense(client)
            .unwrap()
            .into_iter()
            .map(|v| v as f64)
            .collect();
        let (x, xh) = upload(client, &random(&mut rng, 9 * 96, 1.0), &[9, 96], dtype);
        let (b, bh) = upload(client, &bias, &[128], dtype);
        let want = reference::linear(&xh, &pruned, Some(&bh), 9, 96, 128);
        let with_bias = Epilogue::NONE.bias(Some(&b));
        let y = layer.forward(client, &x, with_bias).unwrap();
        assert_close(
            &format!("SparseLinear::forward {dtype}"),
            &y.to_f64_vec(client).unwrap(),
            &want,
            tolerance(dtype),
        );
        let ws = LinearWorkspace::new(client, 9, 96, 128, dtype);
        let (r, rh) = upload(client, &random(&mut rng, 9 * 128, 1.0), &[9, 128], dtype);
        let out = poisoned(client, &[9, 128], dtype);
        let epilogue = with_bias.residual(&r);
        layer
            .forward_into(client, &x, epilogue, &out, Some(&ws))
            .unwrap();
        // The product is rounded to the dtype before the residual is added.
        let rounded = round_to(&want.iter().map(|&v| v as f32).collect::<Vec<_>>(), dtype);
        let want_res: Vec<f64> = rounded.iter().zip(&rh).map(|(p, r)| p + r).collect();
        assert_close(
            &format!("SparseLinear::forward_into + residual {dtype}"),
            &out.to_f64_vec(client).unwrap(),
            &want_res,
            tolerance(dtype),
        );
        // Gated: the 128 rows are 64 gate rows then 64 up rows.
        let out = poisoned(client, &[9, 64], dtype);
        let gated = with_bias.gated(ops::matmul::Activation::Silu);
        layer
            .forward_into(client, &x, gated, &out, Some(&ws))
            .unwrap();
        let want_gated: Vec<f64> = (0..9 * 64)
            .map(|i| {
                let (row, col) = (i / 64, i % 64);
                let g = rounded[row * 128 + col];
                let u = rounded[row * 128 + 64 + col];
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        assert_close(
            &format!("SparseLinear gated {dtype}"),
            &out.to_f64_vec(client).unwrap(),
            &want_gated,
            tolerance(dtype),
        );
        // A dense weight kept whole is the dense layer.
        let full = SparseLinear::from_dense(client, &dense, shape, 32, dtype).unwrap();
        assert_eq!(full.weight.density(), 1.0);
        let want = reference::linear(&xh, &round_to(&dense, dtype), None, 9, 96, 128);
        assert_close(
            &format!("SparseLinear dense {dtype}"),
            &full
                .forward(client, &x, Epilogue::NONE)
                .unwrap()
                .to_f64_vec(client)
                .unwrap(),
            &want,
            tolerance(dtype),
        );
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

fn linear_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let f = DType::F32;
    let mut rng = rng(79);
    let dense = random(&mut rng, 64 * 32, 1.0);
    let w = Bsr::from_dense(client, &dense, [64, 32], 16, f).unwrap();
    let x = DeviceTensor::from_f32(client, &random(&mut rng, 3 * 32, 1.0), &[3, 32], f).unwrap();
    assert!(bsr_linear(client, &x, &w, None).is_ok());
    // Block sizes other than 16/32/64 are refused by the kernel (the format allows them).
    let w8 = Bsr::from_dense(client, &dense, [64, 32], 8, f).unwrap();
    assert_err("block 8", bsr_linear(client, &x, &w8, None), "argument");
    // K of x must be the weight's K.
    let x48 = DeviceTensor::from_f32(client, &[0.5; 3 * 48], &[3, 48], f).unwrap();
    assert_err("K mismatch", bsr_linear(client, &x48, &w, None), "shape");
    let x16 = DeviceTensor::from_f32(client, &[0.5; 3 * 16], &[3, 16], f).unwrap();
    assert_err(
        "K not the weight's",
        bsr_linear(client, &x16, &w, None),
        "shape",
    );
    // Output shape and dtype.
    let bad_out = DeviceTensor::empty(client, &[3, 32], f);
    assert_err(
        "out shape",
        bsr_linear_into(client, &x, &w, None, &bad_out),
        "shape",
    );
    let half_out = DeviceTensor::empty(client, &[3, 64], DType::F16);
    assert_err(
        "out dtype",
        bsr_linear_into(client, &x, &w, None, &half_out),
        "dtype",
    );
    // Bias shape and dtype.
    let b32 = DeviceTensor::from_f32(client, &[0.0; 32], &[32], f).unwrap();
    assert_err(
        "bias shape",
        bsr_linear(client, &x, &w, Some(&b32)),
        "shape",
    );
    let bh = DeviceTensor::from_f32(client, &[0.0; 64], &[64], DType::F16).unwrap();
    assert_err("bias dtype", bsr_linear(client, &x, &w, Some(&bh)), "dtype");
    // Weight dtype must match the input.
    let wh = Bsr::from_dense(client, &dense, [64, 32], 16, DType::F16).unwrap();
    assert_err("weight dtype", bsr_linear(client, &x, &wh, None), "dtype");
    // Integer input, non-contiguous input.
    let ids = DeviceTensor::from_slice(client, &[1i32; 96], &[3, 32]).unwrap();
    assert_err("int input", bsr_linear(client, &ids, &w, None), "dtype");
    let big = DeviceTensor::from_f32(client, &[0.5; 32 * 32], &[32, 32], f).unwrap();
    let strided = big.view(&[3, 32], &[1, 32]).unwrap();
    assert_err("strided", bsr_linear(client, &strided, &w, None), "shape");
    // A launch shape that cannot work.
    let out = DeviceTensor::empty(client, &[3, 64], f);
    assert_err(
        "bad tuning",
        bsr_linear_into_tuned(
            client,
            &x,
            &w,
            None,
            &out,
            Tuning {
                tile_m: Some(24),
                ..Tuning::default()
            },
        ),
        "argument",
    );
    // A one-stage pipeline, and a pipeline where the runtime cannot issue async copies (or
    // the path has no tensor cores), are refused the same way.
    for stages in [1, 5] {
        assert_err(
            "bad pipeline depth",
            bsr_linear_into_tuned(
                client,
                &x,
                &w,
                None,
                &out,
                Tuning {
                    stages: Some(stages),
                    ..Tuning::default()
                },
            ),
            "argument",
        );
    }
    if !client.features().copy_async || !sparse::linear::uses_tensor_cores(client, f) {
        assert_err(
            "pipeline without async copies",
            bsr_linear_into_tuned(
                client,
                &x,
                &w,
                None,
                &out,
                Tuning {
                    stages: Some(3),
                    ..Tuning::default()
                },
            ),
            "argument",
        );
    }
    if !ops::caps::supports_dtype(client, DType::BF16) {
        let xb = DeviceTensor::from_f32(client, &[0.5; 96], &[3, 32], DType::BF16).unwrap();
        assert_err("bf16", bsr_linear(client, &xb, &w, None), "dtype");
    }
}

#[test]
fn bsr_linear_matches_reference_at_every_density() {
    on_each_runtime!(densities_case);
}

#[test]
fn bsr_linear_block_sizes() {
    on_each_runtime!(block_sizes_case);
}

#[test]
fn bsr_linear_m_1024() {
    on_each_runtime!(large_m_case);
}

#[test]
fn bsr_linear_every_tile_shape() {
    on_each_runtime!(tile_shapes_case);
}

#[test]
fn bsr_linear_uneven_rows() {
    on_each_runtime!(uneven_rows_case);
}

#[test]
fn bsr_linear_higher_rank_input() {
    on_each_runtime!(higher_rank_case);
}

#[test]
fn sparse_linear_layer() {
    on_each_runtime!(layer_case);
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

#[test]
fn bsr_linear_rejects_bad_inputs() {
    on_each_runtime!(linear_errors_case);
}
