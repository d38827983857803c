//! The embedding gather, softmax and argmax on Burn tensors.

use super::*;
use burn_backend::IntDType;
use cubecl::ir::{ElemType, IntKind, UIntKind};
use rand::Rng;

/// Whether the runtime has the int dtype `d` (Burn's kernels on an int dtype it lacks panic).
pub(super) fn has_int<R: CubeRuntime>(client: &ComputeClient<R>, d: IntDType) -> bool {
    let elem = match d {
        IntDType::I64 => ElemType::Int(IntKind::I64),
        IntDType::I32 => ElemType::Int(IntKind::I32),
        IntDType::I16 => ElemType::Int(IntKind::I16),
        IntDType::I8 => ElemType::Int(IntKind::I8),
        IntDType::U64 => ElemType::UInt(UIntKind::U64),
        IntDType::U32 => ElemType::UInt(UIntKind::U32),
        IntDType::U16 => ElemType::UInt(UIntKind::U16),
        IntDType::U8 => ElemType::UInt(UIntKind::U8),
    };
    client.properties().supports_type(elem)
}

/// Ids as a Burn int tensor of `dtype`, stored with its two dimensions swapped when `strided`.
fn ids_tensor<R: CubeRuntime>(
    ids: &[i64],
    shape: [usize; 2],
    dtype: IntDType,
    strided: bool,
) -> T<R> {
    let (stored, stored_shape) = if strided {
        swapped_layout(ids, &shape, 0, 1)
    } else {
        (ids.to_vec(), shape.to_vec())
    };
    let data = TensorData::new(stored, stored_shape).convert_dtype(dtype.into());
    let t = B::<R>::int_from_data(data, &device::<R>());
    if strided {
        let t = B::<R>::int_swap_dims(t, 0, 1);
        assert!(!t.is_contiguous());
        t
    } else {
        t
    }
}

fn embedding_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(51);
    // i32 and u32 ids are read as they are; i64 and u8 are converted first.
    let id_dtypes: Vec<IntDType> = [IntDType::I32, IntDType::U32, IntDType::I64, IntDType::U8]
        .into_iter()
        .filter(|&d| has_int(client, d))
        .collect();
    for dtype in float_dtypes(client) {
        for (vocab, hidden, strided_table) in [(50usize, 96usize, false), (37, 33, true)] {
            let table = random(&mut rng, vocab * hidden, 1.0);
            let (tt, tr) = if strided_table {
                input_strided::<R>(&table, &[vocab, hidden], dtype, (0, 1))
            } else {
                input::<R>(&table, &[vocab, hidden], dtype)
            };
            for &id_dtype in &id_dtypes {
                let shape = [3usize, 5usize];
                let ids: Vec<i64> = (0..15).map(|_| rng.random_range(0..vocab as i64)).collect();
                let idt = ids_tensor::<R>(&ids, shape, id_dtype, !strided_table);
                let ours = ops::burn::embedding(tt.clone(), idt).expect("embedding on burn");

                let flat: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
                let flat = B::<R>::int_from_data(TensorData::new(flat, [15]), &device::<R>());
                let want = B::<R>::float_reshape(
                    B::<R>::float_select(tr.clone(), 0, flat),
                    [3, 5, hidden].into(),
                );
                // A gather: exact.
                check(
                    &format!(
                        "burn embedding {dtype} [{vocab}, {hidden}] ids {id_dtype:?} strided_table={strided_table}"
                    ),
                    ours,
                    want,
                    dtype,
                    0.0,
                );
            }
        }
    }
}

fn softmax_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(52);
    for dtype in float_dtypes(client) {
        for (shape, strided) in [
            (vec![7usize, 1000usize], true),
            (vec![3, 33], false),
            (vec![2, 5, 64], true),
        ] {
            let x = random(&mut rng, shape.iter().product(), 4.0);
            let (xt, xr) = if strided {
                input_strided::<R>(&x, &shape, dtype, last_two(&shape))
            } else {
                input::<R>(&x, &shape, dtype)
            };
            let ours = ops::burn::softmax(xt).expect("softmax on burn");
            check(
                &format!("burn softmax {dtype} {shape:?} strided={strided}"),
                ours,
                softmax_ref::<R>(xr),
                dtype,
                tolerance(dtype),
            );
        }
        // Rows 1..6 of a contiguous [7, 64]: a contiguous view into the middle of a buffer (an
        // offset handle where the runtime's alignment allows one), read without a copy.
        let (rows, n) = (7usize, 64usize);
        let x = random(&mut rng, rows * n, 4.0);
        let (xt, xr) = input::<R>(&x, &[rows, n], dtype);
        let middle = |t: T<R>| B::<R>::float_slice(t, &[(1..rows - 1).into(), (0..n).into()]);
        let view = middle(xt);
        assert!(view.is_contiguous());
        let ours = ops::burn::softmax(view).expect("softmax on burn");
        check(
            &format!("burn softmax {dtype} row slice"),
            ours,
            softmax_ref::<R>(middle(xr)),
            dtype,
            tolerance(dtype),
        );
    }
}

fn argmax_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(53);
    let out_dtypes: Vec<IntDType> = [IntDType::I32, IntDType::U32, IntDType::I64, IntDType::U16]
        .into_iter()
        .filter(|&d| has_int(client, d))
        .collect();
    for dtype in float_dtypes(client) {
        for (rows, n) in [(6usize, 1000usize), (5, 33)] {
            // Values in [-1, 1] and one 2.0 per row: a unique maximum in every dtype.
            let mut x = random(&mut rng, rows * n, 1.0);
            let planted: Vec<usize> = (0..rows).map(|_| rng.random_range(0..n)).collect();
            for (r, &c) in planted.iter().enumerate() {
                x[r * n + c] = 2.0;
            }
            let (xt, xr) = input_strided::<R>(&x, &[rows, n], dtype, (0, 1));
            let burn = read_int::<R>(B::<R>::float_argmax(xr, 1, IntDType::I32));
            let want: Vec<i64> = planted.iter().map(|&c| c as i64).collect();
            assert_eq!(burn, want, "Burn's own argmax");
            for &out_dtype in &out_dtypes {
                let ours = ops::burn::argmax(xt.clone(), out_dtype).expect("argmax on burn");
                let what = format!("burn argmax {dtype} {rows}x{n} -> {out_dtype:?}");
                assert_eq!(ours.dtype, out_dtype.into(), "{what}: dtype");
                assert_eq!(shape_of(&ours), [rows, 1], "{what}: shape");
                assert_eq!(read_int::<R>(ours), want, "{what}");
            }
        }
    }
}

#[test]
fn embedding_on_burn_matches_burn_select() {
    on_each_runtime!(embedding_case);
}

#[test]
fn softmax_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(softmax_case);
}

#[test]
fn argmax_on_burn_matches_burn_argmax() {
    on_each_runtime!(argmax_case);
}
