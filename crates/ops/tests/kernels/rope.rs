use cubecl::prelude::*;
use ops::reference::rope as reference;
use ops::rope::{
    fused_rmsnorm_rope, rope_host_positions, rope_into, FusedRmsNormRope, RopeCache, RopeScaling,
};
use ops::{DType, DeviceTensor};
use testkit::*;

fn rope_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(61);
    for dtype in float_dtypes(client) {
        for &(t, h, d, theta) in &[
            (1usize, 12usize, 128usize, 10000.0),
            (17, 2, 64, 1e6),
            (3, 14, 2, 10000.0),
            (33, 3, 18, 500.0),
        ] {
            let max_pos = 600;
            let cache = RopeCache::new(client, max_pos, d, theta).unwrap();
            let (ch, sh) = reference::tables(max_pos, d, theta);
            // Tables as the device holds them (f32).
            let ch: Vec<f64> = ch.iter().map(|&v| v as f32 as f64).collect();
            let sh: Vec<f64> = sh.iter().map(|&v| v as f32 as f64).collect();
            let positions: Vec<usize> = (0..t).map(|i| (i * 37 + 5) % max_pos).collect();
            let pos_u: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
            let pos = DeviceTensor::from_slice(client, &pos_u, &[t]).unwrap();
            let (x, xh) = upload(client, &random(&mut rng, t * h * d, 2.0), &[t, h, d], dtype);
            let out = poisoned(client, &[t, h, d], dtype);
            rope_into(client, &x, &pos, &cache, &out).unwrap();
            let want = reference::rope(&xh, &positions, h, &ch, &sh);
            let what = format!("rope {dtype} {t}x{h}x{d}");
            assert_close(
                &what,
                &out.to_f64_vec(client).unwrap(),
                &want,
                tolerance(dtype),
            );
            // In place.
            rope_into(client, &x, &pos, &cache, &x).unwrap();
            assert_close(
                &format!("{what} in place"),
                &x.to_f64_vec(client).unwrap(),
                &want,
                tolerance(dtype),
            );
        }
    }
}

fn fused_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(62);
    for dtype in float_dtypes(client) {
        for &(b, s, heads, d, four_d) in &[
            (1usize, 1usize, 12usize, 128usize, false),
            (2, 17, 3, 64, true),
            (1, 5, 7, 2, false),
        ] {
            let hidden = heads * d;
            let (x, xh) = upload(
                client,
                &random(&mut rng, b * s * hidden, 2.0),
                &[b, s, hidden],
                dtype,
            );
            let (w, wh) = upload(client, &random(&mut rng, hidden, 1.0), &[hidden], dtype);
            // Full-width HF tables: cos[:, i] == cos[:, i + d/2].
            let (ch, sh) = reference::tables(s + 3, d, 10000.0);
            let full = |t: &[f64]| -> Vec<f32> {
                (0..s)
                    .flat_map(|p| (0..d).map(move |i| t[p * d / 2 + i % (d / 2)] as f32))
                    .collect()
            };
            let shape: Vec<usize> = if four_d { vec![1, s, 1, d] } else { vec![s, d] };
            let (cos, cosh) = upload(client, &full(&ch), &shape, dtype);
            let (sin, sinh) = upload(client, &full(&sh), &shape, dtype);
            let infer = fused_rmsnorm_rope(client, &x, &w, &cos, &sin, 1e-6, None).unwrap();
            let want = reference::fused_rmsnorm_rope(&xh, &wh, &cosh, &sinh, s, d, 1e-6);
            let what = format!("fused_rmsnorm_rope {dtype} {b}x{s}x{heads}x{d}");
            // Two roundings to the dtype (after the norm and after the rotation).
            assert_close(
                &what,
                &infer.to_f64_vec(client).unwrap(),
                &want,
                2.0 * tolerance(dtype),
            );
            let module = FusedRmsNormRope {
                weight: w.clone(),
                head_dim: d,
                eps: 1e-6,
            };
            let got = module.forward(client, &x, &cos, &sin).unwrap();
            assert_close(
                &format!("{what} module"),
                &got.to_f64_vec(client).unwrap(),
                &want,
                2.0 * tolerance(dtype),
            );
        }
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    assert_err(
        "odd head_dim",
        RopeCache::new(client, 8, 7, 1e4).map(|_| ()),
        "argument",
    );
    assert_err(
        "zero positions",
        RopeCache::new(client, 0, 8, 1e4).map(|_| ()),
        "argument",
    );
    assert_err(
        "bad theta",
        RopeCache::new(client, 8, 8, -1.0).map(|_| ()),
        "argument",
    );
    let cache = RopeCache::new(client, 8, 4, 1e4).unwrap();
    let x = DeviceTensor::from_f32(client, &[1.0; 24], &[3, 2, 4], DType::F32).unwrap();
    assert_err(
        "position past the cache",
        rope_host_positions(client, &x, &[0, 1, 8], &cache),
        "argument",
    );
    assert!(rope_host_positions(client, &x, &[0, 1, 7], &cache).is_ok());
    let x2 = DeviceTensor::from_f32(client, &[1.0; 24], &[3, 8], DType::F32).unwrap();
    let pos = DeviceTensor::from_slice(client, &[0u32, 1, 2], &[3]).unwrap();
    let out = DeviceTensor::empty(client, &[3, 8], DType::F32);
    assert_err(
        "rank 2",
        rope_into(client, &x2, &pos, &cache, &out),
        "shape",
    );
    let pos_i = DeviceTensor::from_slice(client, &[0i32, 1, 2], &[3]).unwrap();
    let out3 = DeviceTensor::empty(client, &[3, 2, 4], DType::F32);
    assert_err(
        "positions dtype",
        rope_into(client, &x, &pos_i, &cache, &out3),
        "shape",
    );

    // fused: x [1, 2, 8], head_dim 4.
    let f = |shape: &[usize]| {
        DeviceTensor::from_f32(
            client,
            &vec![0.5; shape.iter().product()],
            shape,
            DType::F32,
        )
        .unwrap()
    };
    let (x, w, cs) = (f(&[1, 2, 8]), f(&[8]), f(&[2, 4]));
    assert!(fused_rmsnorm_rope(client, &x, &w, &cs, &cs, 1e-6, Some(2)).is_ok());
    assert_err(
        "num_heads",
        fused_rmsnorm_rope(client, &x, &w, &cs, &cs, 1e-6, Some(3)),
        "shape",
    );
    assert_err(
        "odd head_dim",
        fused_rmsnorm_rope(
            client,
            &f(&[1, 2, 9]),
            &f(&[9]),
            &f(&[2, 3]),
            &f(&[2, 3]),
            1e-6,
            None,
        ),
        "argument",
    );
    assert_err(
        "not a multiple",
        fused_rmsnorm_rope(client, &f(&[1, 2, 10]), &f(&[10]), &cs, &cs, 1e-6, None),
        "shape",
    );
    assert_err(
        "cos seq",
        fused_rmsnorm_rope(client, &x, &w, &f(&[3, 4]), &f(&[3, 4]), 1e-6, None),
        "shape",
    );
    assert_err(
        "sin shape",
        fused_rmsnorm_rope(client, &x, &w, &cs, &f(&[1, 2, 1, 4]), 1e-6, None),
        "shape",
    );
    assert_err(
        "weight",
        fused_rmsnorm_rope(client, &x, &f(&[4]), &cs, &cs, 1e-6, None),
        "shape",
    );
    assert_err(
        "rank",
        fused_rmsnorm_rope(client, &f(&[2, 8]), &w, &cs, &cs, 1e-6, None),
        "shape",
    );
    assert_err(
        "eps",
        fused_rmsnorm_rope(client, &x, &w, &cs, &cs, f32::NAN, None),
        "argument",
    );
    let wh = DeviceTensor::from_f32(client, &[0.5; 8], &[8], DType::F16).unwrap();
    assert_err(
        "dtype",
        fused_rmsnorm_rope(client, &x, &wh, &cs, &cs, 1e-6, None),
        "dtype",
    );
}

/// Llama 3.1's scaled inverse frequencies written as the published piecewise rule (band by
/// band), independently of the implementation's transformers-style masks.
fn llama3_by_bands(
    head_dim: usize,
    theta: f64,
    (factor, low, high, old): (f64, f64, f64, f64),
) -> (Vec<f64>, [usize; 3]) {
    let mut bands = [0usize; 3];
    let freqs = (0..head_dim / 2)
        .map(|i| {
            let f = 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < old / high {
                bands[0] += 1;
                f
            } else if wavelen > old / low {
                bands[2] += 1;
                f / factor
            } else {
                bands[1] += 1;
                let t = (old / wavelen - low) / (high - low);
                (1.0 - t) * f / factor + t * f
            }
        })
        .collect();
    (freqs, bands)
}

fn llama3_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(63);
    // The test fixture's parameters (all three bands at head_dim 16) and Llama 3.1 8B's.
    for (d, theta, params) in [
        (16usize, 5e5, (8.0, 1.0, 4.0, 64usize)),
        (128, 5e5, (8.0, 1.0, 4.0, 8192)),
    ] {
        let (factor, low, high, old) = params;
        let scaling = RopeScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: old,
        };
        let (want, bands) = llama3_by_bands(d, theta, (factor, low, high, old as f64));
        assert!(bands.iter().all(|&n| n > 0), "d {d}: bands {bands:?}");
        let got = scaling.inv_freq(d, theta);
        assert_close(&format!("llama3 inv_freq d{d}"), &got, &want, 1e-12);
        // The high-frequency end is untouched, the low-frequency end divided by the factor.
        assert_eq!(got[0], 1.0);
        let last = theta.powf(-((d - 2) as f64) / d as f64) / factor;
        assert!((got[d / 2 - 1] - last).abs() <= 1e-15 * last, "d {d}");

        let max_pos = 300;
        let cache = RopeCache::with_scaling(client, max_pos, d, theta, scaling).unwrap();
        assert_eq!(cache.inv_freq, got);
        let explicit = RopeCache::from_inv_freq(client, max_pos, &want).unwrap();
        assert_eq!(explicit.head_dim, d);
        let (ch, sh) = reference::tables_from_inv_freq(max_pos, &want);
        for (what, table, wanted) in [
            ("cos", &cache.cos, &ch),
            ("sin", &cache.sin, &sh),
            ("explicit cos", &explicit.cos, &ch),
            ("explicit sin", &explicit.sin, &sh),
        ] {
            let got = table.to_f64_vec(client).unwrap();
            assert_close(&format!("llama3 {what} d{d}"), &got, wanted, 1e-6);
        }
        // Rotation with the scaled tables, as the model uses them.
        let (t, h) = (5usize, 3usize);
        let positions: Vec<usize> = (0..t).map(|i| i * 61 % max_pos).collect();
        let pos_u: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
        let pos = DeviceTensor::from_slice(client, &pos_u, &[t]).unwrap();
        let (x, xh) = upload(
            client,
            &random(&mut rng, t * h * d, 2.0),
            &[t, h, d],
            DType::F32,
        );
        let out = poisoned(client, &[t, h, d], DType::F32);
        rope_into(client, &x, &pos, &cache, &out).unwrap();
        let as_f32 = |v: &[f64]| v.iter().map(|&c| c as f32 as f64).collect::<Vec<_>>();
        let want_out = reference::rope(&xh, &positions, h, &as_f32(&ch), &as_f32(&sh));
        assert_close(
            &format!("llama3 rope d{d}"),
            &out.to_f64_vec(client).unwrap(),
            &want_out,
            tolerance(DType::F32),
        );
    }
    // Parameters that give no usable frequencies are refused.
    let bad = |factor, low, high, old| {
        RopeCache::with_scaling(
            client,
            8,
            16,
            5e5,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: old,
            },
        )
        .map(|_| ())
    };
    assert_err("low >= high", bad(8.0, 4.0, 4.0, 64), "argument");
    assert_err("zero factor", bad(0.0, 1.0, 4.0, 64), "argument");
    assert_err("nan factor", bad(f64::NAN, 1.0, 4.0, 64), "argument");
    assert_err("no context", bad(8.0, 1.0, 4.0, 0), "argument");
    assert_err(
        "no frequencies",
        RopeCache::from_inv_freq(client, 8, &[]).map(|_| ()),
        "argument",
    );
    assert_err(
        "infinite frequency",
        RopeCache::from_inv_freq(client, 8, &[1.0, f64::INFINITY]).map(|_| ()),
        "argument",
    );
}

#[test]
fn llama3_scaled_tables_follow_the_formula() {
    on_each_runtime!(llama3_case);
}

#[test]
fn rope_matches_reference() {
    on_each_runtime!(rope_case);
}

#[test]
fn fused_rmsnorm_rope_matches_reference() {
    on_each_runtime!(fused_case);
}

#[test]
fn rope_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
