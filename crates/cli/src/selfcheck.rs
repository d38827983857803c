//! The ops self-check behind `cubellm selfcheck`: each kernel once per dtype on random inputs,
//! compared with its CPU f64 reference, as a table a user can read at a glance.

use cubecl::prelude::*;
use ops::{caps, reference, DType, DeviceTensor, OpsError};

/// One row of the table.
#[derive(Debug, Clone)]
pub struct CheckRow {
    pub op: &'static str,
    pub dtype: DType,
    pub shape: String,
    /// Largest `|got - want| / (|want| + rms(want))` over the output.
    pub error: f64,
    pub tolerance: f64,
}

impl CheckRow {
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }
}

/// The error measure of the tests: worst element error relative to its value plus the RMS.
pub fn relative_error(got: &[f64], want: &[f64]) -> f64 {
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            let e = (g - w).abs() / (w.abs() + rms).max(f64::MIN_POSITIVE);
            if e.is_nan() {
                f64::INFINITY
            } else {
                e
            }
        })
        .fold(0.0, f64::max)
}

pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        _ => 1e-2,
    }
}

/// Deterministic pseudo-random values in [-1, 1] (no rand dependency in the library).
pub fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn host<R: Runtime>(client: &ComputeClient<R>, t: &DeviceTensor<R>) -> Result<Vec<f64>, OpsError> {
    t.to_f64_vec(client)
}

/// Runs every check on the runtime behind `client`.
pub fn run<R: Runtime>(client: &ComputeClient<R>) -> Result<Vec<CheckRow>, OpsError> {
    let mut rows = Vec::new();
    for dtype in DType::FLOATS {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let (m, n) = (7, 1000);
        let x = DeviceTensor::from_f32(client, &pseudo_random(m * n, 1), &[m, n], dtype)?;
        let w = DeviceTensor::from_f32(client, &pseudo_random(n, 2), &[n], dtype)?;
        let r = DeviceTensor::from_f32(client, &pseudo_random(m * n, 3), &[m, n], dtype)?;
        let (xh, wh, rh) = (host(client, &x)?, host(client, &w)?, host(client, &r)?);

        let out = ops::norm::rms_norm(client, &x, &w, 1e-6)?;
        let want = ops::reference::norm::rms_norm(&xh, &wh, 1e-6);
        rows.push(CheckRow {
            op: "rms_norm",
            dtype,
            shape: format!("{m}x{n}"),
            error: relative_error(&host(client, &out)?, &want),
            tolerance: tolerance(dtype),
        });

        let (out, sum) = ops::norm::rms_norm_residual(client, &x, &r, &w, 1e-6)?;
        let sum_h = host(client, &sum)?;
        let want = ops::reference::norm::rms_norm(&sum_h, &wh, 1e-6);
        let (_, want_sum) = ops::reference::norm::rms_norm_residual(&xh, &rh, &wh, 1e-6);
        rows.push(CheckRow {
            op: "rms_norm_residual",
            dtype,
            shape: format!("{m}x{n}"),
            error: relative_error(&host(client, &out)?, &want)
                .max(relative_error(&sum_h, &want_sum)),
            tolerance: tolerance(dtype),
        });

        let mut push =
            |op: &'static str, shape: String, got: Vec<f64>, want: Vec<f64>, tol: f64| {
                rows.push(CheckRow {
                    op,
                    dtype,
                    shape,
                    error: relative_error(&got, &want),
                    tolerance: tol,
                })
            };
        let shape = format!("{m}x{n}");
        let got = host(client, &ops::elementwise::add(client, &x, &w)?)?;
        push(
            "add (row broadcast)",
            shape.clone(),
            got,
            reference::elementwise::add(&xh, &wh),
            tolerance(dtype),
        );
        let got = host(client, &ops::elementwise::swiglu(client, &x, &r)?)?;
        push(
            "swiglu",
            shape.clone(),
            got,
            reference::elementwise::swiglu(&xh, &rh),
            tolerance(dtype),
        );
        let got = host(client, &ops::softmax::softmax(client, &x)?)?;
        push(
            "softmax",
            shape.clone(),
            got,
            reference::elementwise::softmax(&xh, n),
            tolerance(dtype),
        );
        let got = host(client, &ops::argmax::argmax(client, &x)?)?;
        let want: Vec<f64> = reference::elementwise::argmax(&xh, n)
            .into_iter()
            .map(f64::from)
            .collect();
        push("argmax", shape.clone(), got, want, 0.0);
        let ids = DeviceTensor::from_slice(client, &[3u32, 0, 6], &[3])?;
        let got = host(client, &ops::embedding::embedding(client, &x, &ids)?)?;
        push(
            "embedding",
            format!("3 of {m}x{n}"),
            got,
            reference::elementwise::embedding(&xh, n, &[3, 0, 6]),
            0.0,
        );

        let (t, heads, d) = (5usize, 4usize, 64usize);
        let q = DeviceTensor::from_f32(
            client,
            &pseudo_random(t * heads * d, 4),
            &[t, heads, d],
            dtype,
        )?;
        let qh = host(client, &q)?;
        let cache = ops::rope::RopeCache::new(client, 64, d, 10000.0)?;
        let positions = [0u32, 7, 8, 30, 63];
        let got = host(
            client,
            &ops::rope::rope_host_positions(client, &q, &positions, &cache)?,
        )?;
        let (ch, sh) = (host(client, &cache.cos)?, host(client, &cache.sin)?);
        let pos: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
        push(
            "rope",
            format!("{t}x{heads}x{d}"),
            got,
            reference::rope::rope(&qh, &pos, heads, &ch, &sh),
            tolerance(dtype),
        );

        let hidden = heads * d;
        let xs = DeviceTensor::from_f32(
            client,
            &pseudo_random(t * hidden, 5),
            &[1, t, hidden],
            dtype,
        )?;
        let ws = DeviceTensor::from_f32(client, &pseudo_random(hidden, 6), &[hidden], dtype)?;
        let full = |tbl: &[f64]| -> Vec<f32> {
            (0..t)
                .flat_map(|p| (0..d).map(move |i| tbl[p * d / 2 + i % (d / 2)] as f32))
                .collect()
        };
        let cos = DeviceTensor::from_f32(client, &full(&ch), &[t, d], dtype)?;
        let sin = DeviceTensor::from_f32(client, &full(&sh), &[t, d], dtype)?;
        let got = host(
            client,
            &ops::rope::fused_rmsnorm_rope(client, &xs, &ws, &cos, &sin, 1e-6, None)?,
        )?;
        let want = reference::rope::fused_rmsnorm_rope(
            &host(client, &xs)?,
            &host(client, &ws)?,
            &host(client, &cos)?,
            &host(client, &sin)?,
            t,
            d,
            1e-6,
        );
        push(
            "fused_rmsnorm_rope",
            format!("1x{t}x{hidden}"),
            got,
            want,
            2.0 * tolerance(dtype),
        );
    }
    Ok(rows)
}
