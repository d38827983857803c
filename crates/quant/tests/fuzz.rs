//! Bounded, seeded fuzzing of the host-side quantization entry points that take caller sizes and
//! arrays: `ByteMatrix::from_dense`, `quantize_weight_8bit`, `quantize_weight_int4`,
//! `check_int4_shape`, `pack_int4` and `unpack_int4` (host only, no device).
//!
//! Sizes are random and adversarial (0, 1, odd, not a multiple of 8 or of the group, products
//! that overflow `usize` or wrap to the slice length), slices may not match them, values include
//! NaN, infinities and subnormals. Every case must return Ok or an `OpsError` (no panic, checked
//! under `catch_unwind`; no allocation above 256 MiB, refused by this binary's allocator; no
//! hang), and an Ok result must be consistent: lengths, padding, scales, codes in range, round
//! trips, dequantization within half a step.
//!
//! Cases per target: 2000 by default (well under a second each in a debug build);
//! `CUBELLM_FUZZ_ITERS=N` runs N per target, `CUBELLM_FUZZ_SEED=S` replays the case of seed `S`
//! that a failure names.

use quant::host::{
    check_int4_shape, pack_int4, quantize_weight_8bit, quantize_weight_int4, unpack_int4,
    ByteMatrix,
};
use quant::QuantFormat;
use rand::Rng;
use testkit::fuzz::{run, run_case};

// --- harness ------------------------------------------------------------------------------------

// The fuzz allocator of `testkit::fuzz`: refuses single allocations above `ALLOC_CAP` in case
// threads (a `#[global_allocator]` has to be declared in each test binary).
#[global_allocator]
static ALLOC: testkit::fuzz::CappedAlloc = testkit::fuzz::CappedAlloc;

// --- inputs -------------------------------------------------------------------------------------

/// A dimension: usually small (0, odd, multiples of 8), sometimes huge.
fn dim(rng: &mut impl Rng) -> usize {
    match rng.random_range(0..10) {
        0 => 0,
        1 => rng.random_range(1..4),
        2 => 8 * rng.random_range(1..5),
        3 => rng.random_range(1..40),
        4 => 1 << rng.random_range(32..64),
        5 => usize::MAX - rng.random_range(0..2),
        _ => 8 * rng.random_range(1..9) + if rng.random_bool(0.2) { 1 } else { 0 },
    }
}

/// `(n, k)` pairs, a fifth of them chosen so that `n * k` wraps around to a small number.
fn dims(rng: &mut impl Rng) -> (usize, usize) {
    if rng.random_bool(0.2) {
        let shift = rng.random_range(1..8);
        let wrap = [
            (1usize << 63, 2),
            (1 << 61, 8),
            (1 << 60, 16),
            (1 << (64 - shift), 1 << shift),
        ];
        let (a, b) = wrap[rng.random_range(0..wrap.len())];
        return if rng.random_bool(0.5) { (a, b) } else { (b, a) };
    }
    (dim(rng), dim(rng))
}

/// A slice length for `[n, k]`: usually right, else off by a little or empty.
fn len_for(rng: &mut impl Rng, n: usize, k: usize) -> usize {
    let right = n.checked_mul(k).filter(|&l| l <= 1 << 16);
    match (right, rng.random_range(0..6)) {
        (Some(l), 0) => l + 1,
        (Some(l), 1) => l.saturating_sub(1),
        (Some(l), _) => l,
        (None, _) => rng.random_range(0..64),
    }
}

fn value(rng: &mut impl Rng) -> f32 {
    match rng.random_range(0..12) {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => -f32::MAX,
        3 => 1e-42,
        4 => 0.0,
        _ => rng.random_range(-4.0..4.0),
    }
}

fn values(rng: &mut impl Rng, len: usize) -> Vec<f32> {
    let special = rng.random_bool(0.2);
    (0..len)
        .map(|_| {
            if special {
                value(rng)
            } else {
                rng.random_range(-2.0..2.0)
            }
        })
        .collect()
}

fn group(rng: &mut impl Rng, k: usize) -> Option<usize> {
    match rng.random_range(0..8) {
        0 | 1 => None,
        2 => Some(k),
        3 => Some([0, 1, 4, 7, 12, 24][rng.random_range(0..6)]),
        4 => Some(usize::MAX - 7),
        _ => Some([8, 16, 32, 64, 128][rng.random_range(0..5)]),
    }
}

// --- properties ---------------------------------------------------------------------------------

#[test]
fn from_dense_byte_matrices_pad_every_row_or_fail_typed() {
    run("ByteMatrix::from_dense", 1, 2000, |rng| {
        let (rows, cols) = dims(rng);
        // A matrix without columns still takes 16 bytes per row: keep those allocations small.
        let rows = if cols == 0 && rows > 1 << 20 && rows <= usize::MAX / 16 {
            rows % 64
        } else {
            rows
        };
        let len = len_for(rng, rows, cols);
        let dense: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let input = format!("rows {rows}, cols {cols}, {len} bytes");
        (
            input,
            Box::new(move || match ByteMatrix::from_dense(rows, cols, &dense) {
                Err(_) => Ok(()),
                Ok(m) => {
                    if m.pitch % 16 != 0 || m.pitch < cols || m.bytes.len() != rows * m.pitch {
                        return Err(format!(
                            "pitch {} / {} bytes for [{rows}, {cols}]",
                            m.pitch,
                            m.bytes.len()
                        ));
                    }
                    if m.dense() != dense {
                        return Err("dense() differs from the input".into());
                    }
                    let padding_zero = (0..rows).all(|r| {
                        m.bytes[r * m.pitch + cols..(r + 1) * m.pitch]
                            .iter()
                            .all(|&b| b == 0)
                    });
                    padding_zero
                        .then_some(())
                        .ok_or_else(|| "non-zero padding".to_string())
                }
            }),
        )
    });
}

#[test]
fn quantize_weight_8bit_gives_consistent_codes_and_scales_or_fails_typed() {
    run("quantize_weight_8bit", 2, 2000, |rng| {
        let (n, k) = dims(rng);
        let len = len_for(rng, n, k);
        let w = values(rng, len);
        let format = if rng.random_bool(0.5) {
            QuantFormat::Int8
        } else {
            QuantFormat::Fp8E4M3
        };
        let input = format!("n {n}, k {k}, {format:?}, w {w:?}");
        (
            input,
            Box::new(move || match quantize_weight_8bit(&w, n, k, format) {
                Err(_) => Ok(()),
                Ok(q) => {
                    if (q.q.rows, q.q.cols, q.scales.len()) != (n, k, n)
                        || q.q.bytes.len() != n * q.q.pitch
                    {
                        return Err(format!(
                            "shapes: [{}, {}] pitch {}, {} scales",
                            q.q.rows,
                            q.q.cols,
                            q.q.pitch,
                            q.scales.len()
                        ));
                    }
                    if !q.scales.iter().all(|s| s.is_finite() && *s > 0.0) {
                        return Err(format!("scales {:?}", q.scales));
                    }
                    let deq = q.dequantize();
                    for (i, (&d, &x)) in deq.iter().zip(&w).enumerate() {
                        let s = q.scales[i / k] as f64;
                        // Within one step of the largest code's spacing (fp8 e4m3 is coarser).
                        let tol = s * if format == QuantFormat::Int8 {
                            0.5
                        } else {
                            32.0
                        } + 1e-30;
                        if !d.is_finite() || (d - x as f64).abs() > tol.max(x.abs() as f64 * 0.07) {
                            return Err(format!("element {i}: {x} dequantizes to {d} (scale {s})"));
                        }
                    }
                    Ok(())
                }
            }),
        )
    });
}

#[test]
fn quantize_weight_int4_packs_round_trips_and_dequantizes_within_half_a_step_or_fails_typed() {
    run("quantize_weight_int4", 3, 2000, |rng| {
        let (n, k) = dims(rng);
        let g = group(rng, k);
        let len = len_for(rng, n, k);
        let w = values(rng, len);
        let input = format!("n {n}, k {k}, group {g:?}, w {w:?}");
        (
            input,
            Box::new(move || match quantize_weight_int4(&w, n, k, g) {
                Err(_) => Ok(()),
                Ok(q) => {
                    let groups = k / g.unwrap_or(k);
                    if (q.n, q.k, q.packed.len(), q.scales.len()) != (n, k, k / 8 * n, groups * n) {
                        return Err(format!(
                            "n {} k {} packed {} scales {}",
                            q.n,
                            q.k,
                            q.packed.len(),
                            q.scales.len()
                        ));
                    }
                    let codes = unpack_int4(&q.packed, k, n).map_err(|e| format!("unpack: {e}"))?;
                    if pack_int4(&codes, k, n).map_err(|e| format!("repack: {e}"))? != q.packed {
                        return Err("pack(unpack(packed)) differs".into());
                    }
                    let deq = q.dequantize();
                    for nn in 0..n {
                        for kk in 0..k {
                            let (x, d, s) = (
                                w[nn * k + kk] as f64,
                                deq[nn * k + kk],
                                q.scale(kk, nn) as f64,
                            );
                            if !(s.is_finite() && s > 0.0)
                                || (d - x).abs() > s * 0.5 + 1e-30 + x.abs() * 1e-6
                            {
                                return Err(format!(
                                    "w[{nn}, {kk}] = {x} dequantizes to {d} (scale {s})"
                                ));
                            }
                        }
                    }
                    Ok(())
                }
            }),
        )
    });
}

#[test]
fn pack_and_unpack_int4_of_random_codes_round_trip_or_fail_typed() {
    run("pack_int4", 4, 2000, |rng| {
        let (k, n) = dims(rng);
        let len = len_for(rng, k, n);
        let wide = rng.random_bool(0.1);
        let codes: Vec<i8> = (0..len)
            .map(|_| {
                if wide {
                    rng.random()
                } else {
                    rng.random_range(-8..=7)
                }
            })
            .collect();
        let words: Vec<i32> = (0..len_for(rng, k / 8, n)).map(|_| rng.random()).collect();
        let input = format!("k {k}, n {n}, codes {codes:?}, words {words:?}");
        (
            input,
            Box::new(move || {
                let _ = check_int4_shape("fuzz", k, n, None);
                match pack_int4(&codes, k, n) {
                    Ok(p) if unpack_int4(&p, k, n).as_deref() != Ok(&codes[..]) => {
                        return Err("unpack(pack(codes)) differs".into())
                    }
                    Ok(p) if p.len() != k / 8 * n => return Err(format!("{} words", p.len())),
                    _ => {}
                }
                match unpack_int4(&words, k, n) {
                    Ok(c) if c.len() != k * n || c.iter().any(|v| !(-8..=7).contains(v)) => {
                        Err(format!("{} codes, or out of range", c.len()))
                    }
                    Ok(c) if pack_int4(&c, k, n).as_deref() != Ok(&words[..]) => {
                        Err("pack(unpack(words)) differs".into())
                    }
                    _ => Ok(()),
                }
            }),
        )
    });
}

/// Fixed inputs: sizes whose product wraps around `usize` to the slice length (0 here) were
/// accepted in a release build and overflowed in a debug one.
#[test]
fn sizes_whose_product_wraps_to_the_slice_length_are_errors() {
    let cases: [(usize, usize); 4] = [(1 << 63, 2), (2, 1 << 63), (1 << 61, 8), (8, 1 << 61)];
    for (i, (n, k)) in cases.into_iter().enumerate() {
        let input = format!("n {n}, k {k}, empty slices");
        run_case(
            "wrapping-sizes",
            i as u64,
            input,
            Box::new(move || {
                let ok = [
                    quantize_weight_8bit(&[], n, k, QuantFormat::Int8).is_ok(),
                    quantize_weight_int4(&[], n, k, None).is_ok(),
                    pack_int4(&[], k, n).is_ok(),
                    unpack_int4(&[], k, n).is_ok(),
                    ByteMatrix::from_dense(n, k, &[]).is_ok(),
                    ByteMatrix::from_dense(n.max(k), 0, &[]).is_ok(),
                ];
                if ok.iter().any(|&o| o) {
                    return Err(format!("accepted: {ok:?}"));
                }
                Ok(())
            }),
        );
    }
}
