//! Quantization: host encoders and packing (exhaustive / round-trip), the per-row quantize
//! kernels (bit-exact against the host rules), and the quantized GEMMs and layers against f64
//! references of the same quantized arithmetic plus the format's error bound.

use cubecl::prelude::*;
use ops::dtype::e4m3_to_f64;
use ops::{DType, DeviceTensor};
use quant::format::{self, f32_to_e4m3, QuantFormat, SCALE_FLOOR};
use quant::host::{self, pack_int4, unpack_int4, ByteMatrix};
use quant::reference as qref;
use rand::Rng;
use testkit::*;

// ---------------------------------------------------------------------------------------------
// Host: fp8 e4m3 encoder
// ---------------------------------------------------------------------------------------------

/// The nearest e4m3 code by brute force over all finite codes (ties to the even mantissa), with
/// the encoder's sign convention (sign set iff v < 0).
fn nearest_e4m3(v: f32) -> u8 {
    let a = (v.abs() as f64).min(448.0);
    let mut best = 0u8;
    for c in 0u8..0x7F {
        let (d, bd) = ((e4m3_to_f64(c) - a).abs(), (e4m3_to_f64(best) - a).abs());
        if d < bd || (d == bd && c & 1 == 0) {
            best = c;
        }
    }
    best | if v < 0.0 { 0x80 } else { 0 }
}

#[test]
fn e4m3_encoder_matches_brute_force_on_every_f16() {
    for bits in 0..=u16::MAX {
        let v = half::f16::from_bits(bits).to_f32();
        if !v.is_finite() {
            continue;
        }
        assert_eq!(
            f32_to_e4m3(v),
            nearest_e4m3(v),
            "f16 bits {bits:#06x} = {v}"
        );
    }
}

#[test]
fn e4m3_encoder_round_trips_codes_and_ties_to_even() {
    for c in 0u8..=0xFF {
        if c & 0x7F == 0x7F {
            continue; // NaN codes
        }
        let v = e4m3_to_f64(c) as f32;
        let want = if c == 0x80 { 0 } else { c }; // -0.0 encodes as +0
        assert_eq!(f32_to_e4m3(v), want, "code {c:#04x}");
    }
    // Midpoints between neighbours go to the even code; one f32 ulp either side goes to the
    // nearer neighbour.
    for c in 0u8..0x7E {
        let (lo, hi) = (e4m3_to_f64(c), e4m3_to_f64(c + 1));
        let mid = ((lo + hi) / 2.0) as f32;
        assert_eq!(mid as f64, (lo + hi) / 2.0, "midpoint exact in f32");
        let even = if c & 1 == 0 { c } else { c + 1 };
        assert_eq!(
            f32_to_e4m3(mid),
            even,
            "tie between {c:#04x} and {:#04x}",
            c + 1
        );
        assert_eq!(f32_to_e4m3(mid.next_down()), c);
        assert_eq!(f32_to_e4m3(mid.next_up()), c + 1);
        assert_eq!(f32_to_e4m3(-mid), even | 0x80);
    }
    for (v, want) in [
        (448.0f32, 0x7E),
        (449.0, 0x7E),
        (1e30, 0x7E),
        (f32::INFINITY, 0x7E),
        (-1e30, 0xFE),
        (f32::NEG_INFINITY, 0xFE),
        (2f32.powi(-9), 0x01),
        (2f32.powi(-10), 0x00),
        (2f32.powi(-10).next_up(), 0x01),
        (-2f32.powi(-11), 0x80),
    ] {
        assert_eq!(f32_to_e4m3(v), want, "{v}");
    }
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
}

// ---------------------------------------------------------------------------------------------
// Host: int4 packing and weight quantization
// ---------------------------------------------------------------------------------------------

#[test]
fn int4_packing_layout_and_round_trip() {
    // One column, K = 8: nibbles low first, two's complement.
    let q = [1i8, -1, 2, -2, 7, -8, 0, 3];
    let packed = pack_int4(&q, 8, 1).unwrap();
    assert_eq!(packed, vec![0x3087_E2F1u32 as i32]);
    assert_eq!(unpack_int4(&packed, 8, 1).unwrap(), q);
    let mut rng = rng(40);
    for (k, n) in [(8usize, 1usize), (64, 3), (136, 17), (256, 33)] {
        let q: Vec<i8> = (0..k * n).map(|_| rng.random_range(-8i8..=7)).collect();
        let packed = pack_int4(&q, k, n).unwrap();
        assert_eq!(packed.len(), k / 8 * n);
        assert_eq!(unpack_int4(&packed, k, n).unwrap(), q, "K={k} N={n}");
        // Column n of word row kw holds q[8kw.., n]: check one element directly.
        let (kk, nn) = (k - 3, n - 1);
        let w = packed[(kk / 8) * n + nn];
        assert_eq!(((w << (28 - 4 * (kk % 8))) >> 28) as i8, q[kk * n + nn]);
    }
    assert_err("K % 8", pack_int4(&[0; 12], 12, 1), "shape");
    assert_err("code range", pack_int4(&[8; 8], 8, 1), "argument");
    assert_err("length", pack_int4(&[0; 8], 8, 2), "shape");
    assert_err("unpack length", unpack_int4(&[0; 3], 16, 2), "shape");
}

#[test]
fn weight_quantization_round_trips_within_the_format_bound() {
    let mut rng = rng(41);
    for (n, k) in [(1usize, 1usize), (3, 33), (17, 127), (8, 256)] {
        let mut w = random(&mut rng, n * k, 1.0);
        w[..k].fill(0.0); // an all-zero output channel
        if n > 2 {
            w[2 * k] = 300.0; // an outlier
        }
        for fmt in [QuantFormat::Int8, QuantFormat::Fp8E4M3] {
            let qw = host::quantize_weight_8bit(&w, n, k, fmt).unwrap();
            assert_eq!(qw.q.pitch % 16, 0);
            assert_eq!(qw.scales[0], SCALE_FLOOR, "zero row gets the floor");
            let deq = qw.dequantize();
            for r in 0..n {
                let s = qw.scales[r] as f64;
                for c in 0..k {
                    let (x, d) = (w[r * k + c] as f64, deq[r * k + c]);
                    let bound = match fmt {
                        // Half a step, plus f32 rounding of the quotient.
                        QuantFormat::Int8 => 0.5 * s * (1.0 + 1e-6),
                        // Half an ulp of a 3-bit mantissa, or half the subnormal step.
                        QuantFormat::Fp8E4M3 => {
                            (x.abs() / 16.0).max(s * 2f64.powi(-10)) * (1.0 + 1e-6)
                        }
                    };
                    assert!(
                        (x - d).abs() <= bound,
                        "{fmt:?} [{r},{c}] {x} -> {d} (s {s})"
                    );
                }
                // The pad bytes are zero.
                assert!(qw.q.bytes[r * qw.q.pitch + k..(r + 1) * qw.q.pitch]
                    .iter()
                    .all(|&b| b == 0));
            }
        }
        for g in [None, Some(8usize)] {
            if k % 8 != 0 {
                assert_err("int4 K", host::quantize_weight_int4(&w, n, k, g), "shape");
                continue;
            }
            let q4 = host::quantize_weight_int4(&w, n, k, g).unwrap();
            let deq = q4.dequantize();
            for r in 0..n {
                for c in 0..k {
                    let s = q4.scale(c, r) as f64;
                    let (x, d) = (w[r * k + c] as f64, deq[r * k + c]);
                    assert!(
                        (x - d).abs() <= 0.5 * s * (1.0 + 1e-6),
                        "int4 {g:?} [{r},{c}]"
                    );
                }
            }
        }
    }
    let w = random(&mut rng, 4 * 64, 1.0);
    assert_err(
        "group divides K",
        host::quantize_weight_int4(&w, 4, 64, Some(48)),
        "shape",
    );
    assert_err(
        "group multiple of 8",
        host::quantize_weight_int4(&w, 4, 64, Some(4)),
        "argument",
    );
    assert_err(
        "group zero",
        host::quantize_weight_int4(&w, 4, 64, Some(0)),
        "argument",
    );
    let mut bad = w.clone();
    bad[5] = f32::NAN;
    assert_err(
        "nan weight",
        host::quantize_weight_8bit(&bad, 4, 64, QuantFormat::Int8),
        "argument",
    );
    assert_err(
        "weight length",
        host::quantize_weight_8bit(&w, 5, 64, QuantFormat::Int8),
        "shape",
    );
}

// ---------------------------------------------------------------------------------------------
// Device: per-row quantization
// ---------------------------------------------------------------------------------------------

/// Rows with the awkward cases: random, all zero, one large outlier, tiny values.
fn awkward_rows(rng: &mut rand::rngs::StdRng, m: usize, k: usize, outlier: f32) -> Vec<f32> {
    let mut x = random(rng, m * k, 2.0);
    if m > 1 {
        x[k..2 * k].fill(0.0);
    }
    if m > 2 {
        x[2 * k + k / 2] = outlier;
    }
    if m > 3 {
        for v in &mut x[3 * k..4 * k] {
            *v *= 1e-3;
        }
    }
    x
}

/// Reads the whole buffer of a padded byte matrix (to check the padding too).
fn raw_bytes<R: Runtime>(client: &ComputeClient<R>, t: &DeviceTensor<R>) -> Vec<u8> {
    client.read_one(t.handle().clone()).unwrap().to_vec()
}

fn quantize_per_row_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(42);
    for dtype in float_dtypes(client) {
        for fmt in [QuantFormat::Int8, QuantFormat::Fp8E4M3] {
            // M = 16 is the most rows a decode step quantizes; K = 9000 the longest rows (the
            // 1.5B model's down projection has 8960).
            for m in [1usize, 3, 16, 17, 64] {
                for k in [1usize, 3, 33, 64, 127, 256, 1000, 9000] {
                    if (m == 64 && k == 1000 && dtype != DType::F16)
                        || (k == 9000 && m != 1 && m != 16)
                    {
                        continue;
                    }
                    let x = awkward_rows(&mut rng, m, k, 3000.0);
                    let (xt, xh) = upload(client, &x, &[m, k], dtype);
                    let (q, s) = quant::quantize_per_row(client, &xt, fmt).unwrap();
                    let what = format!("{fmt:?} {dtype} {m}x{k}");
                    let (want_q, want_s) = qref::quantize_rows(&xh, m, k, fmt);
                    assert_exact(
                        &format!("scales {what}"),
                        &s.to_vec::<f32>(client).unwrap(),
                        &want_s,
                    );
                    assert_exact(
                        &format!("codes {what}"),
                        &q.to_bytes(client).unwrap(),
                        &want_q,
                    );
                    let pitch = format::row_pitch(k);
                    let raw = raw_bytes(client, &q);
                    for r in 0..m {
                        assert!(
                            raw[r * pitch + k..(r + 1) * pitch].iter().all(|&b| b == 0),
                            "{what}: row {r} padding not zero"
                        );
                    }
                    if m > 1 {
                        assert_eq!(want_s[1], SCALE_FLOOR, "zero row");
                    }
                }
            }
        }
    }
}

fn quantize_per_row_3d_and_into_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(43);
    let x = random(&mut rng, 2 * 3 * 40, 1.0);
    let (xt, xh) = upload(client, &x, &[2, 3, 40], DType::F32);
    let q = quant::layout::empty_byte_matrix(client, 6, 40, DType::I8);
    let s = poisoned(client, &[6], DType::F32);
    quant::quantize_per_row_into(client, &xt, QuantFormat::Int8, &q, &s).unwrap();
    let (want_q, want_s) = qref::quantize_rows(&xh, 6, 40, QuantFormat::Int8);
    assert_exact("3d codes", &q.to_bytes(client).unwrap(), &want_q);
    assert_exact("3d scales", &s.to_vec::<f32>(client).unwrap(), &want_s);
    // A host ByteMatrix upload reads back as the same logical bytes.
    let bm = ByteMatrix::from_dense(6, 40, &want_q).unwrap();
    assert_exact(
        "upload",
        &bm.upload(client, DType::I8).to_bytes(client).unwrap(),
        &want_q,
    );
}

fn quantize_per_row_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    use quant::quantize_per_row_into as into;
    let x = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::F32).unwrap();
    let ids = DeviceTensor::from_slice(client, &[1i32; 12], &[3, 4]).unwrap();
    assert_err(
        "int input",
        quant::quantize_per_row(client, &ids, QuantFormat::Int8),
        "dtype",
    );
    let strided = x.view(&[4, 3], &[1, 4]).unwrap();
    assert_err(
        "non-contiguous",
        quant::quantize_per_row(client, &strided, QuantFormat::Int8),
        "shape",
    );
    let s3 = DeviceTensor::empty(client, &[3], DType::F32);
    let q_fp8 = quant::layout::empty_byte_matrix(client, 3, 4, DType::F8E4M3);
    let q_i8 = quant::layout::empty_byte_matrix(client, 3, 4, DType::I8);
    assert_err(
        "q dtype",
        into(client, &x, QuantFormat::Int8, &q_fp8, &s3),
        "dtype",
    );
    let q_rows = quant::layout::empty_byte_matrix(client, 2, 4, DType::I8);
    assert_err(
        "q rows",
        into(client, &x, QuantFormat::Int8, &q_rows, &s3),
        "shape",
    );
    let s2 = DeviceTensor::empty(client, &[2], DType::F32);
    assert_err(
        "scale len",
        into(client, &x, QuantFormat::Int8, &q_i8, &s2),
        "shape",
    );
    let s_h = DeviceTensor::empty(client, &[3], DType::F16);
    assert_err(
        "scale dtype",
        into(client, &x, QuantFormat::Int8, &q_i8, &s_h),
        "dtype",
    );
    // A contiguous [3, 4] i8 tensor has a 4-byte pitch: not the padded layout.
    let dense = DeviceTensor::from_slice(client, &[0i8; 12], &[3, 4]).unwrap();
    assert_err(
        "unpadded q",
        into(client, &x, QuantFormat::Int8, &dense, &s3),
        "shape",
    );
    if !ops::caps::supports_dtype(client, DType::BF16) {
        let xb = DeviceTensor::from_f32(client, &[1.0; 12], &[3, 4], DType::BF16).unwrap();
        assert_err(
            "bf16 unsupported",
            quant::quantize_per_row(client, &xb, QuantFormat::Int8),
            "dtype",
        );
    }
}

/// Rows whose scale is exactly 1 (amax = Qmax) so that the quotients are the inputs: every fp8
/// code, every midpoint (ties to even), the subnormal range and ±448; for int8 the .5 ties.
fn quantize_per_row_ties_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut fp8_row: Vec<f32> = vec![448.0];
    for c in 0u8..0x7E {
        let (lo, hi) = (e4m3_to_f64(c), e4m3_to_f64(c + 1));
        let mid = ((lo + hi) / 2.0) as f32;
        fp8_row.extend([lo as f32, mid, -mid, mid.next_up(), mid.next_down()]);
    }
    let k = fp8_row.len();
    let (xt, _) = upload(client, &fp8_row, &[1, k], DType::F32);
    let (q, s) = quant::quantize_per_row(client, &xt, QuantFormat::Fp8E4M3).unwrap();
    assert_eq!(s.to_vec::<f32>(client).unwrap(), vec![1.0]);
    let want: Vec<u8> = fp8_row.iter().map(|&v| f32_to_e4m3(v)).collect();
    assert_exact("fp8 ties", &q.to_bytes(client).unwrap(), &want);

    let mut int8_row: Vec<f32> = vec![-127.0];
    for i in -127..127 {
        int8_row.extend([i as f32 + 0.5, i as f32 + 0.25, i as f32 + 0.75]);
    }
    let k = int8_row.len();
    let (xt, _) = upload(client, &int8_row, &[1, k], DType::F32);
    let (q, _) = quant::quantize_per_row(client, &xt, QuantFormat::Int8).unwrap();
    let want: Vec<u8> = int8_row
        .iter()
        .map(|&v| format::int8_encode(v) as u8)
        .collect();
    assert_exact("int8 ties", &q.to_bytes(client).unwrap(), &want);
}

#[test]
fn quantize_per_row_rounds_ties_to_even() {
    on_each_runtime!(quantize_per_row_ties_case);
}

#[test]
fn quantize_per_row_matches_host_rules() {
    on_each_runtime!(quantize_per_row_case);
}

#[test]
fn quantize_per_row_3d_and_into() {
    on_each_runtime!(quantize_per_row_3d_and_into_case);
}

#[test]
fn quantize_per_row_rejects_bad_inputs() {
    on_each_runtime!(quantize_per_row_errors_case);
}
