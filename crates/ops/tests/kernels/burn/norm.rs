//! RMSNorm (plain, with the residual add, fused with RoPE) and RoPE on Burn tensors.

use super::*;
use ops::rope::RopeCache;

fn rms_norm_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(7);
    let eps = 1e-6;
    for dtype in float_dtypes(client) {
        for (rows, n, strided) in [(5usize, 96usize, false), (3, 1000, true), (17, 33, true)] {
            let x = random(&mut rng, rows * n, 2.0);
            let w = random(&mut rng, n, 1.0);
            let (xt, xr) = if strided {
                input_strided::<R>(&x, &[rows, n], dtype, (0, 1))
            } else {
                input::<R>(&x, &[rows, n], dtype)
            };
            let (wt, wr) = input::<R>(&w, &[n], dtype);
            let ours = ops::burn::rms_norm(xt, wt, eps).expect("rms_norm on burn");
            check(
                &format!("burn rms_norm {dtype} {rows}x{n} strided={strided}"),
                ours,
                rms_norm_ref::<R>(xr, wr, eps),
                dtype,
                tolerance(dtype),
            );
        }
    }
}

fn rms_norm_residual_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(21);
    let eps = 1e-6;
    for dtype in float_dtypes(client) {
        for (shape, strided) in [
            (vec![1usize, 64usize], false),
            (vec![7, 96], true),
            (vec![2, 13, 1000], true),
        ] {
            let n = *shape.last().unwrap();
            let numel: usize = shape.iter().product();
            let x = random(&mut rng, numel, 2.0);
            let r = random(&mut rng, numel, 2.0);
            let w = random(&mut rng, n, 1.0);
            // The residual is the strided operand: the op must copy an input other than x too.
            let (xt, xr) = input::<R>(&x, &shape, dtype);
            let (rt, rr) = if strided {
                input_strided::<R>(&r, &shape, dtype, last_two(&shape))
            } else {
                input::<R>(&r, &shape, dtype)
            };
            let (wt, wr) = input::<R>(&w, &[n], dtype);
            let (normed, sum) =
                ops::burn::rms_norm_residual(xt, rt, wt, eps).expect("rms_norm_residual on burn");
            let want_sum = B::<R>::float_add(xr, rr);
            let want = rms_norm_ref::<R>(want_sum.clone(), wr, eps);
            let name = format!("burn rms_norm_residual {dtype} {shape:?} strided={strided}");
            check(
                &format!("{name} sum"),
                sum,
                want_sum,
                dtype,
                tolerance(dtype),
            );
            check(
                &format!("{name} normed"),
                normed,
                want,
                dtype,
                tolerance(dtype),
            );
        }
    }
}

/// Hugging Face's `rotate_half` RoPE with Burn's ops: `x[T, H, D]`, `cos`/`sin` `[T, 1, D/2]`.
fn rope_ref<R: CubeRuntime>(x: T<R>, cos: T<R>, sin: T<R>) -> T<R> {
    let s = shape_of(&x);
    let (t, h, d) = (s[0], s[1], s[2]);
    let half = |range: std::ops::Range<usize>| {
        B::<R>::float_slice(x.clone(), &[(0..t).into(), (0..h).into(), range.into()])
    };
    let (x1, x2) = (half(0..d / 2), half(d / 2..d));
    let first = B::<R>::float_sub(
        B::<R>::float_mul(x1.clone(), cos.clone()),
        B::<R>::float_mul(x2.clone(), sin.clone()),
    );
    let second = B::<R>::float_add(B::<R>::float_mul(x2, cos), B::<R>::float_mul(x1, sin));
    B::<R>::float_cat(vec![first, second], 2)
}

fn rope_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(22);
    let max_positions = 48;
    for dtype in float_dtypes(client) {
        for (t, h, d, strided) in [(7usize, 3usize, 64usize, true), (5, 2, 128, false)] {
            let cache = RopeCache::new(client, max_positions, d, 10000.0).unwrap();
            // Out of order and repeating, so that a position is not confused with the token index.
            let positions: Vec<u32> = (0..t)
                .map(|i| ((i * 17 + 5) % max_positions) as u32)
                .collect();
            let x = random(&mut rng, t * h * d, 2.0);
            // Strided: stored as [H, T, D] (Burn's attention layout), viewed as [T, H, D].
            let (xt, xr) = if strided {
                input_strided::<R>(&x, &[t, h, d], dtype, (0, 1))
            } else {
                input::<R>(&x, &[t, h, d], dtype)
            };
            let ours = ops::burn::rope(xt, &positions, &cache).expect("rope on burn");

            let (mut cos, mut sin) = (Vec::new(), Vec::new());
            for &p in &positions {
                for &f in &cache.inv_freq {
                    let (s, c) = (p as f64 * f).sin_cos();
                    cos.push(c as f32);
                    sin.push(s as f32);
                }
            }
            let table = |v: Vec<f32>| {
                B::<R>::float_from_data(TensorData::new(v, [t, 1, d / 2]), &device::<R>())
            };
            let want = rope_ref::<R>(xr, table(cos), table(sin));
            check(
                &format!("burn rope {dtype} t{t} h{h} d{d} strided={strided}"),
                ours,
                want,
                dtype,
                tolerance(dtype),
            );
        }
    }
}

fn fused_rmsnorm_rope_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    let mut rng = rng(8);
    let (b, s, heads, d) = (2, 5, 3, 16);
    let h = heads * d;
    let eps = 1e-6;
    // Hugging Face's tables: the angle of frequency j repeated in both halves of the head.
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for pos in 0..s {
        for i in 0..d {
            let j = i % (d / 2);
            let angle = pos as f32 * 10000f32.powf(-2.0 * j as f32 / d as f32);
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    for dtype in float_dtypes(client) {
        for strided in [false, true] {
            let x = random(&mut rng, b * s * h, 2.0);
            let w = random(&mut rng, h, 1.0);
            let (xt, xr) = if strided {
                input_strided::<R>(&x, &[b, s, h], dtype, (0, 1))
            } else {
                input::<R>(&x, &[b, s, h], dtype)
            };
            let (wt, wr) = input::<R>(&w, &[h], dtype);
            let (ct, cr) = input::<R>(&cos, &[s, d], dtype);
            let (st, sr) = input::<R>(&sin, &[s, d], dtype);
            let ours = ops::burn::fused_rmsnorm_rope(xt, wt, ct, st, eps, None)
                .expect("fused_rmsnorm_rope on burn");

            // RMSNorm over h, then per head x * cos + rotate_half(x) * sin.
            let normed = rms_norm_ref::<R>(xr, wr, eps);
            let q = B::<R>::float_reshape(normed, [b, s, heads, d].into());
            let part = |range: std::ops::Range<usize>| {
                B::<R>::float_slice(
                    q.clone(),
                    &[
                        (0..b).into(),
                        (0..s).into(),
                        (0..heads).into(),
                        range.into(),
                    ],
                )
            };
            let rotated =
                B::<R>::float_cat(vec![B::<R>::float_neg(part(d / 2..d)), part(0..d / 2)], 3);
            let c = B::<R>::float_reshape(cr, [1, s, 1, d].into());
            let sn = B::<R>::float_reshape(sr, [1, s, 1, d].into());
            let want = B::<R>::float_add(B::<R>::float_mul(q, c), B::<R>::float_mul(rotated, sn));
            let want = B::<R>::float_reshape(want, [b, s, h].into());
            check(
                &format!("burn fused_rmsnorm_rope {dtype} strided={strided}"),
                ours,
                want,
                dtype,
                // Rounded to the dtype after the norm, after the weight and after the rotation
                // (the rope suite allows the same).
                2.0 * tolerance(dtype),
            );
        }
    }
}

#[test]
fn rms_norm_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(rms_norm_case);
}

#[test]
fn rms_norm_residual_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(rms_norm_residual_case);
}

#[test]
fn rope_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(rope_case);
}

#[test]
fn fused_rmsnorm_rope_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(fused_rmsnorm_rope_case);
}
