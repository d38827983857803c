//! `bsr_linear` against the dense reference: densities, block sizes, long inputs, every launch
//! shape, uneven block-rows (the split-K work list) and inputs of rank 3.

use cubecl::prelude::*;
use ops::DType;
use rand::rngs::StdRng;
use sparse::{bsr_linear, bsr_linear_into_tuned, reference, Bsr, Tuning};
use testkit::*;

use super::{blocky, random_mask};

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
