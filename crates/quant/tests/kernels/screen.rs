//! The int8 screening head ([`quant::screen`]): its coefficients bound the distance between its
//! logits and the float GEMV's on every row, and the screened argmax over them returns the float
//! head's id (`argmax(linear(x, w))` on the device) at awkward shapes, with ties, for inputs of
//! the scale a final RMSNorm gives.

use cubecl::prelude::*;
use ops::argmax::screened::{screened_argmax_into, ScreenScratch, Screened};
use ops::linear::{Epilogue, Linear};
use ops::DeviceTensor;
use quant::screen::{can_screen, screening_head};
use testkit::*;

fn screen_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(71);
    for dtype in float_dtypes(client) {
        for &(n, k, x_scale) in &[
            (1000usize, 48usize, 1.0f32),
            (4099, 96, 30.0),
            (20_011, 64, 4.0),
        ] {
            assert!(can_screen(client, dtype, k), "{dtype} k {k}");
            let (x, xh) = upload(client, &random(&mut rng, k, x_scale), &[1, k], dtype);
            // Rows of different scales (each row's int8 scale differs), and a tie for the top.
            let mut wv = rows_of_rising_scale(&mut rng, n, k);
            wv.iter_mut().for_each(|v| *v *= 0.01);
            let dot = |wv: &[f32], r: usize| -> f64 {
                wv[r * k..(r + 1) * k]
                    .iter()
                    .zip(&xh)
                    .map(|(w, x)| *w as f64 * x)
                    .sum()
            };
            let best = (0..n)
                .max_by(|&a, &b| dot(&wv, a).total_cmp(&dot(&wv, b)))
                .unwrap();
            let top: Vec<f32> = wv[best * k..(best + 1) * k].to_vec();
            for at in [n / 3, n - 2] {
                wv[at * k..(at + 1) * k].copy_from_slice(&top);
            }
            let (w, wh) = upload(client, &wv, &[n, k], dtype);
            let rounded: Vec<f32> = wh.iter().map(|&v| v as f32).collect();
            let head = screening_head(client, &rounded, [n, k], dtype).unwrap();
            let approx = DeviceTensor::empty(client, &[1, n], dtype);
            head.linear
                .forward_into(client, &x, Epilogue::NONE, &approx, None)
                .unwrap();
            let logits = ops::matmul::linear(client, &x, &w, None, None).unwrap();
            let want = ops::argmax::argmax(client, &logits)
                .unwrap()
                .to_vec::<u32>(client)
                .unwrap();
            let what = format!("screening head {dtype} {n}x{k} x·{x_scale}");

            // The bound, on the values as stored (both rounded to the dtype).
            let (y, a) = (
                logits.to_f32_vec(client).unwrap(),
                approx.to_f32_vec(client).unwrap(),
            );
            let coef = head.coef.to_vec::<f32>(client).unwrap();
            let nx = xh.iter().map(|v| v * v).sum::<f64>().sqrt();
            let rounding = match dtype {
                ops::DType::BF16 => 2f64.powi(-8),
                ops::DType::F16 => 2f64.powi(-11),
                _ => 0.0,
            };
            let mut width = 0f64;
            for i in 0..n {
                let (y, a) = (y[i] as f64, a[i] as f64);
                let allowed = nx * coef[i] as f64 + (y.abs() + a.abs()) * rounding + 1e-6;
                assert!(
                    (y - a).abs() <= allowed,
                    "{what}: row {i}: |{y} - {a}| > {allowed}"
                );
                width += nx * coef[i] as f64;
            }
            // The rows that survive the screen, on the host: few, or the screen buys nothing.
            let low = (0..n)
                .map(|i| a[i] as f64 - nx * coef[i] as f64)
                .fold(f64::MIN, f64::max);
            let survivors = (0..n)
                .filter(|&i| a[i] as f64 + nx * coef[i] as f64 >= low)
                .count();
            assert!(
                survivors < n / 10,
                "{what}: {survivors} of {n} rows survive"
            );
            println!(
                "{what}: mean bound {:.3e}, {survivors} of {n} rows survive",
                width / n as f64
            );

            let scratch = ScreenScratch::new(client, n).unwrap();
            let out = DeviceTensor::from_slice(client, &[u32::MAX], &[1]).unwrap();
            let s = Screened {
                x: &x,
                w: &w,
                approx: &approx,
                coef: &head.coef,
            };
            screened_argmax_into(client, s, &out, &scratch).unwrap();
            assert_exact(&what, &out.to_vec::<u32>(client).unwrap(), &want);
            // The device's bounds are the host's with a little more slack: at least as many
            // rows, and still few.
            let rescored = scratch.rows_rescored(client).unwrap() as usize;
            assert!(
                (survivors..n / 10).contains(&rescored),
                "{what}: {rescored} rows computed again, {survivors} on the host"
            );
        }
    }
}

#[test]
fn screening_head_bounds_hold_and_the_screened_argmax_is_exact() {
    on_each_runtime!(screen_case);
}
