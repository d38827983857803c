use cubecl::prelude::*;
use ops::argmax::{
    argmax, argmax_into, argmax_split_advance_into, argmax_split_into, split_need, NextRow,
};
use ops::gemm::{SplitNeed, SplitScratch};
use ops::reference::elementwise as reference;
use ops::{DType, DeviceTensor};
use testkit::*;

fn argmax_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(41);
    for dtype in float_dtypes(client) {
        for &n in AWKWARD.iter().chain(&[151_936usize]) {
            let rows = if n > 10_000 { 2 } else { 5 };
            let mut v = random(&mut rng, rows * n, 4.0);
            if n > 3 {
                // A tie for the maximum in row 0: the first index must win.
                let m = v[..n].iter().cloned().fold(f32::MIN, f32::max) + 1.0;
                v[n / 3] = m;
                v[n - 1] = m;
            }
            let (x, xh) = upload(client, &v, &[rows, n], dtype);
            let out = DeviceTensor::from_slice(client, &vec![u32::MAX; rows], &[rows]).unwrap();
            argmax_into(client, &x, &out).unwrap();
            assert_exact(
                &format!("argmax {dtype} {rows}x{n}"),
                &out.to_vec::<u32>(client).unwrap(),
                &reference::argmax(&xh, n),
            );
        }
        // NaN never wins; a row of only NaN gives 0.
        let x = DeviceTensor::from_f32(
            client,
            &[f32::NAN, 1.0, f32::NAN, 0.5, f32::NAN, f32::NAN],
            &[3, 2],
            dtype,
        )
        .unwrap();
        assert_exact(
            "argmax NaN",
            &argmax(client, &x).unwrap().to_vec::<u32>(client).unwrap(),
            &[1, 1, 0],
        );
    }
}

/// The split argmax of `x` against `want`, twice on one scratch (its counters must be left at
/// zero for the next call).
fn check_twice<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    scratch: &SplitScratch<R>,
    want: &[u32],
    what: &str,
) {
    let rows = want.len();
    for round in 0..2 {
        let out = DeviceTensor::from_slice(client, &vec![u32::MAX; rows], &[rows]).unwrap();
        argmax_split_into(client, x, &out, scratch).unwrap();
        assert_exact(
            &format!("split argmax {what} round {round}"),
            &out.to_vec::<u32>(client).unwrap(),
            want,
        );
    }
}

/// The split argmax (rows across cubes on CUDA, one cube per row elsewhere or without room in
/// the scratch) against the reference: awkward lengths, a vocabulary of 152k and one past a
/// whole number of cubes, ties (first index), NaN, rows of only NaN and of equal values, each
/// call twice on one scratch (the counters must be left at zero).
fn split_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(43);
    let cuda = ops::caps::runtime_name(client).contains("cuda");
    for dtype in float_dtypes(client) {
        for &n in AWKWARD.iter().chain(&[151_936usize, 2048 * 8 + 8]) {
            let rows = if n > 10_000 { 3 } else { 5 };
            let need = split_need(client, rows, n, dtype);
            assert_eq!(need != SplitNeed::default(), cuda, "split on CUDA only");
            let scratch = SplitScratch::new(client, need);
            let mut v = random(&mut rng, rows * n, 4.0);
            if n > 3 {
                // Row 0: a tie for the maximum, the first index must win; row 1: the maximum
                // last; row 2: NaN around a maximum in the middle.
                let m = v[..n].iter().cloned().fold(f32::MIN, f32::max) + 1.0;
                v[n / 3] = m;
                v[n - 1] = m;
                v[2 * n - 1] = 100.0;
                v[2 * n] = f32::NAN;
                v[2 * n + n / 2] = 100.0;
                v[3 * n - 1] = f32::NAN;
            }
            let (x, xh) = upload(client, &v, &[rows, n], dtype);
            let want = reference::argmax(&xh, n);
            check_twice(client, &x, &scratch, &want, &format!("{dtype} {rows}x{n}"));
        }
        // One row (a decode step) and 16 (a batched step) of the vocabulary.
        for (rows, n) in [(1usize, 151_936usize), (16, 151_936), (16, 1000)] {
            let scratch = SplitScratch::new(client, split_need(client, rows, n, dtype));
            let (x, xh) = upload(client, &random(&mut rng, rows * n, 4.0), &[rows, n], dtype);
            let want = reference::argmax(&xh, n);
            check_twice(client, &x, &scratch, &want, &format!("{dtype} {rows}x{n}"));
        }
        // Rows of only NaN give 0; equal values give the first index; a scratch without room
        // falls back to one cube per row.
        let n = 40_000;
        let mut v = vec![f32::NAN; n];
        v.extend(vec![2.5f32; n]);
        let (x, _) = upload(client, &v, &[2, n], dtype);
        for scratch in [
            SplitScratch::new(client, split_need(client, 2, n, dtype)),
            SplitScratch::new(client, SplitNeed::default()),
        ] {
            let out = DeviceTensor::from_slice(client, &[u32::MAX; 2], &[2]).unwrap();
            argmax_split_into(client, &x, &out, &scratch).unwrap();
            assert_exact(
                "split argmax NaN / equal",
                &out.to_vec::<u32>(client).unwrap(),
                &[0, 0],
            );
        }
    }
}

/// A scratch for one row of `n` logits: with room for the split argmax (which then runs where
/// the runtime splits rows) or without (one cube per row).
fn one_row_scratch<R: Runtime>(
    client: &ComputeClient<R>,
    room: bool,
    n: usize,
    dtype: DType,
) -> SplitScratch<R> {
    let need = if room {
        split_need(client, 1, n, dtype)
    } else {
        SplitNeed::default()
    };
    SplitScratch::new(client, need)
}

/// The argmax that advances two counters: the id as the plain argmax's, and each counter one
/// higher per call, split (CUDA) and on one cube (a scratch without room, or off CUDA).
fn advance_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(47);
    for (dtype, n) in float_dtypes(client)
        .into_iter()
        .flat_map(|d| [(d, 151_936usize), (d, 1000)])
    {
        let (x, xh) = upload(client, &random(&mut rng, n, 4.0), &[1, n], dtype);
        let want = reference::argmax(&xh, n);
        for room in [true, false] {
            let scratch = one_row_scratch(client, room, n, dtype);
            let first = DeviceTensor::from_slice(client, &[7u32], &[1]).unwrap();
            let second = DeviceTensor::from_slice(client, &[100u32], &[1]).unwrap();
            let even = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
            let odd = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
            for call in 1..=3u32 {
                let out = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
                // The slot the second counter's parity picks gets the id; the other keeps the
                // sentinel written before this call.
                let (hit, kept) = if (100 + call - 1) % 2 == 0 {
                    (&even, &odd)
                } else {
                    (&odd, &even)
                };
                kept.write_bytes(client, &u32::MAX.to_le_bytes()).unwrap();
                argmax_split_advance_into(
                    client,
                    &x,
                    &out,
                    &scratch,
                    [&first, &second],
                    [&even, &odd],
                    None,
                )
                .unwrap();
                let what = format!("advancing argmax {dtype} 1x{n} room {room} call {call}");
                assert_exact(&what, &out.to_vec::<u32>(client).unwrap(), &want);
                assert_eq!(
                    (
                        first.to_vec::<u32>(client).unwrap(),
                        second.to_vec::<u32>(client).unwrap()
                    ),
                    (vec![7 + call], vec![100 + call]),
                    "{what}: counters"
                );
                assert_exact(
                    &format!("{what}: the parity's slot"),
                    &hit.to_vec::<u32>(client).unwrap(),
                    &want,
                );
                assert_eq!(
                    kept.to_vec::<u32>(client).unwrap(),
                    vec![u32::MAX],
                    "{what}: the other slot"
                );
            }
        }
    }
    // The counters advance once per launch: one row only, and u32[1] counters.
    let dtype = float_dtypes(client)[0];
    let scratch = SplitScratch::new(client, split_need(client, 2, 64, dtype));
    let (x, _) = upload(client, &random(&mut rng, 128, 1.0), &[2, 64], dtype);
    let out = DeviceTensor::empty(client, &[2], DType::U32);
    let one = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let other = DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap();
    let (even, odd) = (
        DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap(),
        DeviceTensor::from_slice(client, &[0u32], &[1]).unwrap(),
    );
    let slots = [&even, &odd];
    let err = argmax_split_advance_into(client, &x, &out, &scratch, [&one, &other], slots, None);
    assert_err("two rows", err, "shape");
    let (x, _) = upload(client, &random(&mut rng, 64, 1.0), &[1, 64], dtype);
    let out = DeviceTensor::empty(client, &[1], DType::U32);
    let wide = DeviceTensor::from_slice(client, &[0u32, 0], &[2]).unwrap();
    let err = argmax_split_advance_into(client, &x, &out, &scratch, [&one, &wide], slots, None);
    assert_err("a counter of two", err, "shape");
    let two_slots = [&even, &wide];
    let err =
        argmax_split_advance_into(client, &x, &out, &scratch, [&one, &other], two_slots, None);
    assert_err("a slot of two", err, "shape");
    assert_eq!(one.to_vec::<u32>(client).unwrap(), vec![0], "nothing ran");
}

/// The advancing argmax that gathers the chosen id's row of an embedding table: the row copied
/// bit for bit, split (CUDA) and on one cube, at widths whose vectors are narrower than the
/// logits' (12 or 7 beside 1 000 logits), wider than one vector a unit of the gathering cube
/// (4 104) and with a table of more rows than logits; mismatched tables and rows are refused before anything runs.
fn gather_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(53);
    for dtype in float_dtypes(client) {
        for (n, extra_rows, hidden) in [
            (151_936usize, 0usize, 16usize),
            (1000, 3, 12),
            (1000, 0, 7),
            (1000, 0, 4104),
        ] {
            let (x, xh) = upload(client, &random(&mut rng, n, 4.0), &[1, n], dtype);
            let want = reference::argmax(&xh, n)[0] as usize;
            let rows = n + extra_rows;
            let (table, th) = upload(
                client,
                &random(&mut rng, rows * hidden, 2.0),
                &[rows, hidden],
                dtype,
            );
            for room in [true, false] {
                let scratch = one_row_scratch(client, room, n, dtype);
                let counters =
                    [0u32, 0].map(|v| DeviceTensor::from_slice(client, &[v], &[1]).unwrap());
                let slots =
                    [0u32, 0].map(|v| DeviceTensor::from_slice(client, &[v], &[1]).unwrap());
                let out = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
                let row =
                    DeviceTensor::from_f32(client, &vec![f32::NAN; hidden], &[1, hidden], dtype)
                        .unwrap();
                argmax_split_advance_into(
                    client,
                    &x,
                    &out,
                    &scratch,
                    [&counters[0], &counters[1]],
                    [&slots[0], &slots[1]],
                    Some(NextRow {
                        table: &table,
                        row: &row,
                    }),
                )
                .unwrap();
                let what =
                    format!("gathering argmax {dtype} 1x{n}, table {rows}x{hidden}, room {room}");
                assert_exact(&what, &out.to_vec::<u32>(client).unwrap(), &[want as u32]);
                let got: Vec<f64> = row
                    .to_f32_vec(client)
                    .unwrap()
                    .into_iter()
                    .map(f64::from)
                    .collect();
                assert_eq!(
                    got,
                    th[want * hidden..(want + 1) * hidden].to_vec(),
                    "{what}: the row"
                );
            }
        }
        // A table without a row for every logit, a row of another width or dtype.
        let n = 64;
        let (x, _) = upload(client, &random(&mut rng, n, 1.0), &[1, n], dtype);
        let scratch = SplitScratch::new(client, split_need(client, 1, n, dtype));
        let one = [0u32; 4].map(|v| DeviceTensor::from_slice(client, &[v], &[1]).unwrap());
        let out = DeviceTensor::empty(client, &[1], DType::U32);
        let short = DeviceTensor::empty(client, &[n - 1, 8], dtype);
        let table = DeviceTensor::empty(client, &[n, 8], dtype);
        let row = DeviceTensor::empty(client, &[1, 8], dtype);
        let wide = DeviceTensor::empty(client, &[1, 9], dtype);
        let other = if dtype == DType::F32 {
            DType::F16
        } else {
            DType::F32
        };
        let other_row = DeviceTensor::empty(client, &[1, 8], other);
        for (what, table, row, kind) in [
            ("a short table", &short, &row, "shape"),
            ("a row of another width", &table, &wide, "shape"),
            ("a row of another dtype", &table, &other_row, "dtype"),
        ] {
            let err = argmax_split_advance_into(
                client,
                &x,
                &out,
                &scratch,
                [&one[0], &one[1]],
                [&one[2], &one[3]],
                Some(NextRow { table, row }),
            );
            assert_err(what, err, kind);
        }
        assert_eq!(
            one[0].to_vec::<u32>(client).unwrap(),
            vec![0],
            "nothing ran"
        );
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let x = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let wrong = DeviceTensor::empty(client, &[4], DType::U32);
    let wrong_dtype = DeviceTensor::empty(client, &[3], DType::I32);
    assert_err("out len", argmax_into(client, &x, &wrong), "shape");
    assert_err("out dtype", argmax_into(client, &x, &wrong_dtype), "shape");
    let ids = DeviceTensor::from_slice(client, &[1u32; 4], &[4]).unwrap();
    assert_err("int input", argmax(client, &ids), "dtype");
}

#[test]
fn argmax_matches_reference() {
    on_each_runtime!(argmax_case);
}

#[test]
fn split_argmax_matches_reference() {
    on_each_runtime!(split_case);
}

#[test]
fn advancing_argmax_matches_reference_and_counts() {
    on_each_runtime!(advance_case);
}

#[test]
fn advancing_argmax_gathers_the_chosen_row() {
    on_each_runtime!(gather_case);
}

#[test]
fn argmax_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
