//! The screened argmax against `argmax(linear(x, w))` on the device (the id it promises, bit for
//! bit) and the host's f64 argmax where the top logits are apart: approximations from an 8-bit
//! copy of the weights with their bounds, approximations as wrong as the bounds allow, bounds
//! that screen nothing, ties across and within the rescoring cubes, NaN, the advancing form
//! (counters, parity slot, gathered row) and bad inputs.

use cubecl::prelude::*;
use ops::argmax::screened::{
    screened_argmax_advance_into, screened_argmax_into, ScreenScratch, Screened,
};
use ops::argmax::NextRow;
use ops::{DType, DeviceTensor};
use rand::Rng;
use testkit::*;

/// `γ_K = K·2^-24 / (1 - K·2^-24)`: the relative error of an f32 sum of K products.
fn gamma(k: usize) -> f64 {
    let u = (k as f64) * 2f64.powi(-24);
    u / (1.0 - u)
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// The per-row int8 copy of `w` (`[n, k]`, values as the device holds them): the
/// approximations `s_i · Σ x_k q_ik` (f64) and coefficients `‖w_i - s_i q_i‖₂ + γ_K ‖w_i‖₂`
/// (the second term covers the GEMV's own f32 sum), with 1% to spare.
fn int8_approx(w: &[f64], x: &[f64], k: usize) -> (Vec<f32>, Vec<f32>) {
    let mut approx = Vec::new();
    let mut coef = Vec::new();
    for row in w.chunks(k) {
        let amax = row.iter().fold(0f64, |m, v| m.max(v.abs()));
        let s = if amax > 0.0 { amax / 127.0 } else { 0.0 };
        let q: Vec<f64> = row
            .iter()
            .map(|v| {
                if s > 0.0 {
                    (v / s).round().clamp(-127.0, 127.0)
                } else {
                    0.0
                }
            })
            .collect();
        let err: Vec<f64> = row.iter().zip(&q).map(|(v, q)| v - s * q).collect();
        approx.push((s * q.iter().zip(x).map(|(q, x)| q * x).sum::<f64>()) as f32);
        coef.push(((norm(&err) + gamma(k) * norm(row)) * 1.01) as f32);
    }
    (approx, coef)
}

/// The exact products' f64 values, each moved by up to 90% of `spread · ‖x‖₂`, and
/// coefficients that cover that and the GEMV's f32 sum.
fn noisy_approx(
    rng: &mut rand::rngs::StdRng,
    w: &[f64],
    x: &[f64],
    k: usize,
    spread: f64,
) -> (Vec<f32>, Vec<f32>) {
    let nx = norm(x);
    let mut approx = Vec::new();
    let mut coef = Vec::new();
    for row in w.chunks(k) {
        let exact: f64 = row.iter().zip(x).map(|(w, x)| w * x).sum();
        let moved = exact + rng.random_range(-0.9..=0.9) * spread * nx;
        approx.push(moved as f32);
        coef.push(((spread + gamma(k) * norm(row)) * 1.01) as f32);
    }
    (approx, coef)
}

/// The id `argmax(linear(x, w))` gives on the device.
fn device_reference<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
) -> u32 {
    let logits = ops::matmul::linear(client, x, w, None, None).unwrap();
    ops::argmax::argmax(client, &logits)
        .unwrap()
        .to_vec::<u32>(client)
        .unwrap()[0]
}

/// Runs the screened argmax twice on one scratch (its state must be left as found) and
/// returns the id.
#[allow(clippy::too_many_arguments)]
fn screened_twice<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    approx: &[f32],
    coef: &[f32],
    dtype: DType,
    scratch: &ScreenScratch<R>,
    what: &str,
) -> u32 {
    let n = coef.len();
    let approx = DeviceTensor::from_f32(client, approx, &[1, n], dtype).unwrap();
    let coef = DeviceTensor::from_slice(client, coef, &[n]).unwrap();
    let s = Screened {
        x,
        w,
        approx: &approx,
        coef: &coef,
    };
    let mut ids = Vec::new();
    for _ in 0..2 {
        let out = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
        screened_argmax_into(client, s, &out, scratch).unwrap();
        ids.push(out.to_vec::<u32>(client).unwrap()[0]);
    }
    assert_eq!(ids[0], ids[1], "{what}: the second call on one scratch");
    ids[0]
}

fn matches_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(53);
    for dtype in float_dtypes(client) {
        for &(n, k) in &[
            (1usize, 16usize),
            (37, 7),
            (1000, 64),
            (4099, 96),
            (20_011, 40),
        ] {
            let (x, xh) = upload(client, &random(&mut rng, k, 1.0), &[1, k], dtype);
            let mut wv = random(&mut rng, n * k, 0.5);
            if n > 100 {
                // A tie for the largest logit: identical rows in different rescoring cubes and
                // next to each other; the first index must win.
                let best = (0..n)
                    .max_by(|&a, &b| {
                        let d = |r: usize| -> f32 {
                            wv[r * k..(r + 1) * k]
                                .iter()
                                .zip(&xh)
                                .map(|(w, x)| w * *x as f32)
                                .sum()
                        };
                        d(a).total_cmp(&d(b))
                    })
                    .unwrap();
                let row: Vec<f32> = wv[best * k..(best + 1) * k]
                    .iter()
                    .map(|v| v * 1.5)
                    .collect();
                for at in [n / 2, n / 2 + 1, n - 1, 3] {
                    wv[at * k..(at + 1) * k].copy_from_slice(&row);
                }
            }
            let (w, wh) = upload(client, &wv, &[n, k], dtype);
            let want = device_reference(client, &x, &w);
            let scratch = ScreenScratch::new(client, n).unwrap();
            let what = format!("screened argmax {dtype} {n}x{k}");
            let (approx, coef) = int8_approx(&wh, &xh, k);
            let got = screened_twice(client, &x, &w, &approx, &coef, dtype, &scratch, &what);
            assert_eq!(got, want, "{what}: int8 approximations");
            if n > 100 {
                assert_eq!(want, 3, "{what}: the tie's first index");
            }
            for spread in [1e-3, 0.05, 1e3] {
                let before = scratch.rows_rescored(client).unwrap();
                let (approx, coef) = noisy_approx(&mut rng, &wh, &xh, k, spread);
                let got = screened_twice(client, &x, &w, &approx, &coef, dtype, &scratch, &what);
                assert_eq!(got, want, "{what}: approximations off by {spread}·‖x‖");
                if spread > 1.0 {
                    // Bounds wider than every logit's spread keep every row (in both calls).
                    let rescored = scratch.rows_rescored(client).unwrap() - before;
                    assert_eq!(rescored as usize, 2 * n, "{what}: rows computed again");
                }
            }
        }
    }
}

/// A large top gap: the id is also the host's f64 argmax.
fn host_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(59);
    let (n, k) = (3000usize, 128usize);
    for dtype in float_dtypes(client) {
        let (x, xh) = upload(client, &random(&mut rng, k, 1.0), &[1, k], dtype);
        let mut wv = random(&mut rng, n * k, 0.1);
        let top = 1234;
        for (j, v) in wv[top * k..(top + 1) * k].iter_mut().enumerate() {
            *v = xh[j].signum() as f32 * 0.5;
        }
        let (w, wh) = upload(client, &wv, &[n, k], dtype);
        let host = (0..n)
            .map(|r| {
                wh[r * k..(r + 1) * k]
                    .iter()
                    .zip(&xh)
                    .map(|(w, x)| w * x)
                    .sum::<f64>()
            })
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap()
            .0 as u32;
        let (approx, coef) = int8_approx(&wh, &xh, k);
        let scratch = ScreenScratch::new(client, n).unwrap();
        let got = screened_twice(client, &x, &w, &approx, &coef, dtype, &scratch, "host");
        assert_eq!(
            (got, host),
            (top as u32, top as u32),
            "screened argmax {dtype}: host f64"
        );
    }
}

/// NaN: a NaN row is never chosen, a NaN input makes every logit NaN (id 0), and NaN
/// approximations screen nothing.
fn nan_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(61);
    let (n, k) = (700usize, 32usize);
    for dtype in float_dtypes(client) {
        let mut xv = random(&mut rng, k, 1.0);
        let (x, xh) = upload(client, &xv, &[1, k], dtype);
        let mut wv = random(&mut rng, n * k, 0.5);
        wv[5 * k + 3] = f32::NAN;
        let (w, wh) = upload(client, &wv, &[n, k], dtype);
        let want = device_reference(client, &x, &w);
        assert_ne!(want, 5);
        let scratch = ScreenScratch::new(client, n).unwrap();
        let (mut approx, coef) = int8_approx(&wh, &xh, k);
        let got = screened_twice(client, &x, &w, &approx, &coef, dtype, &scratch, "NaN row");
        assert_eq!(got, want, "screened argmax {dtype}: a NaN row");
        approx.iter_mut().step_by(3).for_each(|a| *a = f32::NAN);
        let got = screened_twice(
            client,
            &x,
            &w,
            &approx,
            &coef,
            dtype,
            &scratch,
            "NaN approx",
        );
        assert_eq!(got, want, "screened argmax {dtype}: NaN approximations");
        xv[0] = f32::NAN;
        let (x, _) = upload(client, &xv, &[1, k], dtype);
        let got = screened_twice(client, &x, &w, &approx, &coef, dtype, &scratch, "NaN x");
        assert_eq!(got, 0, "screened argmax {dtype}: a NaN input");
    }
}

/// The advancing form: counters, the parity's slot and the gathered row, as the split
/// argmax's advancing form does them.
fn advance_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(67);
    let (n, k, hidden) = (2000usize, 48usize, 12usize);
    for dtype in float_dtypes(client) {
        let (x, xh) = upload(client, &random(&mut rng, k, 1.0), &[1, k], dtype);
        let (w, wh) = upload(client, &random(&mut rng, n * k, 0.5), &[n, k], dtype);
        let want = device_reference(client, &x, &w);
        let (approx, coef) = int8_approx(&wh, &xh, k);
        let approx = DeviceTensor::from_f32(client, &approx, &[1, n], dtype).unwrap();
        let coef = DeviceTensor::from_slice(client, &coef, &[n]).unwrap();
        let (table, table_h) = upload(
            client,
            &random(&mut rng, n * hidden, 1.0),
            &[n, hidden],
            dtype,
        );
        let row = DeviceTensor::from_f32(client, &vec![0.0; hidden], &[1, hidden], dtype).unwrap();
        let scratch = ScreenScratch::new(client, n).unwrap();
        let first = DeviceTensor::from_slice(client, &[7u32], &[1]).unwrap();
        let second = DeviceTensor::from_slice(client, &[100u32], &[1]).unwrap();
        let even = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
        let odd = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
        let s = Screened {
            x: &x,
            w: &w,
            approx: &approx,
            coef: &coef,
        };
        for call in 1..=2u32 {
            let out = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
            let next = NextRow {
                table: &table,
                row: &row,
            };
            screened_argmax_advance_into(
                client,
                s,
                &out,
                &scratch,
                [&first, &second],
                [&even, &odd],
                Some(next),
            )
            .unwrap();
            let what = format!("screened advancing argmax {dtype} call {call}");
            assert_eq!(out.to_vec::<u32>(client).unwrap(), vec![want], "{what}");
            assert_eq!(
                (
                    first.to_vec::<u32>(client).unwrap(),
                    second.to_vec::<u32>(client).unwrap()
                ),
                (vec![7 + call], vec![100 + call]),
                "{what}: counters"
            );
            let hit = if call % 2 == 1 { &even } else { &odd };
            assert_eq!(
                hit.to_vec::<u32>(client).unwrap(),
                vec![want],
                "{what}: slot"
            );
            let gathered: Vec<f64> = row
                .to_f32_vec(client)
                .unwrap()
                .iter()
                .map(|&v| v as f64)
                .collect();
            let id = want as usize;
            assert_exact(
                &format!("{what}: row"),
                &gathered,
                &table_h[id * hidden..(id + 1) * hidden],
            );
        }
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let dtype = float_dtypes(client)[0];
    let (n, k) = (64usize, 16usize);
    let x = DeviceTensor::from_f32(client, &[1.0; 16], &[1, k], dtype).unwrap();
    let x2 = DeviceTensor::from_f32(client, &[1.0; 32], &[2, k], dtype).unwrap();
    let w = DeviceTensor::from_f32(client, &vec![0.5; n * k], &[n, k], dtype).unwrap();
    let approx = DeviceTensor::from_f32(client, &vec![0.0; n], &[1, n], dtype).unwrap();
    let short = DeviceTensor::from_f32(client, &vec![0.0; n - 1], &[1, n - 1], dtype).unwrap();
    let coef = DeviceTensor::from_slice(client, &vec![1.0f32; n], &[n]).unwrap();
    let coef_u32 = DeviceTensor::from_slice(client, &vec![1u32; n], &[n]).unwrap();
    let scratch = ScreenScratch::new(client, n).unwrap();
    let other = ScreenScratch::new(client, n + 1).unwrap();
    let out = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
    let wide = DeviceTensor::from_slice(client, &[0u32, 0], &[2]).unwrap();
    let ok = Screened {
        x: &x,
        w: &w,
        approx: &approx,
        coef: &coef,
    };
    let cases = [
        (
            "two rows",
            Screened { x: &x2, ..ok },
            &scratch,
            &out,
            "shape",
        ),
        (
            "short approx",
            Screened {
                approx: &short,
                ..ok
            },
            &scratch,
            &out,
            "shape",
        ),
        (
            "u32 coef",
            Screened {
                coef: &coef_u32,
                ..ok
            },
            &scratch,
            &out,
            "shape",
        ),
        ("x as w", Screened { w: &x, ..ok }, &scratch, &out, "shape"),
        ("scratch", ok, &other, &out, "shape"),
        ("out of two", ok, &scratch, &wide, "shape"),
    ];
    for (what, s, scratch, out, kind) in cases {
        assert_err(what, screened_argmax_into(client, s, out, scratch), kind);
    }
    assert_eq!(
        out.to_vec::<u32>(client).unwrap(),
        vec![u32::MAX],
        "nothing ran"
    );
}

#[test]
fn screened_argmax_matches_the_gemv_argmax() {
    on_each_runtime!(matches_case);
}

#[test]
fn screened_argmax_matches_the_host() {
    on_each_runtime!(host_case);
}

#[test]
fn screened_argmax_handles_nan() {
    on_each_runtime!(nan_case);
}

#[test]
fn screened_argmax_advances_and_gathers() {
    on_each_runtime!(advance_case);
}

#[test]
fn screened_argmax_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
