//! The number formats and their host-side encoders: the single source of truth for how a float
//! becomes a quantized code. The kernels implement exactly these rules with integer operations,
//! and the tests compare them bit for bit.
//!
//! Conventions (symmetric quantization, no zero point):
//! - scale `s = max(amax / Qmax, SCALE_FLOOR)`, computed in f32;
//! - quotient `v = x / s` in f32 (an IEEE division, the same on host and device);
//! - int8: `q = clamp(round_half_even(v), -127, 127)`;
//! - fp8 e4m3: `q = e4m3(clamp(v, -448, 448))`, rounded to nearest even;
//! - int4: `q = clamp(round_half_even(v), -8, 7)` with `Qmax = 7`.

use ops::DType;

/// Largest int8 code used (symmetric: -127..=127, -128 is never produced).
pub const INT8_QMAX: f32 = 127.0;
/// Largest finite fp8 e4m3 ("fn" variant) magnitude.
pub const FP8_QMAX: f32 = 448.0;
/// Largest int4 code: codes span -8..=7, and scales use 7 so that `-amax` and `amax` both map
/// to codes in range (-8 is never produced by rounding, like -128 for int8).
pub const INT4_QMAX: f32 = 7.0;
/// Smallest scale: an all-zero (or denormal-tiny) row gets this scale instead of dividing by zero.
/// Any positive floor works because every |x| <= amax <= floor * Qmax then quantizes in range;
/// 1e-12 is far below the smallest f16 activation scale (6e-8 / 448) that matters.
pub const SCALE_FLOOR: f32 = 1e-12;

/// The formats of per-row (per-token) activation quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// Symmetric int8, Qmax 127.
    Int8,
    /// fp8 e4m3 (OCP "fn"), Qmax 448.
    Fp8E4M3,
}

impl QuantFormat {
    pub fn qmax(self) -> f32 {
        match self {
            QuantFormat::Int8 => INT8_QMAX,
            QuantFormat::Fp8E4M3 => FP8_QMAX,
        }
    }

    /// The dtype of the quantized tensor.
    pub fn dtype(self) -> DType {
        match self {
            QuantFormat::Int8 => DType::I8,
            QuantFormat::Fp8E4M3 => DType::F8E4M3,
        }
    }

    /// Encodes one quotient `v = x / s` into the format's byte.
    pub fn encode(self, v: f32) -> u8 {
        match self {
            QuantFormat::Int8 => int8_encode(v) as u8,
            QuantFormat::Fp8E4M3 => f32_to_e4m3(v),
        }
    }

    /// Decodes one byte of the format.
    pub fn decode(self, b: u8) -> f64 {
        match self {
            QuantFormat::Int8 => b as i8 as f64,
            QuantFormat::Fp8E4M3 => ops::dtype::e4m3_to_f64(b),
        }
    }
}

/// Row pitch (bytes) of the 8-bit matrices this crate produces and its GEMMs accept: a multiple
/// of 16 so that every row starts on a 16-byte boundary and is read with 16-byte loads. The
/// bytes between `k` and the pitch are zero in what we produce and are ignored by the kernels.
pub fn row_pitch(k: usize) -> usize {
    k.div_ceil(16).max(1) * 16
}

/// The symmetric scale for a group whose largest magnitude is `amax`.
pub fn scale_for(amax: f32, qmax: f32) -> f32 {
    (amax / qmax).max(SCALE_FLOOR)
}

/// Round half to even in f32 (what `torch.round` does), as the kernels compute it.
pub fn round_half_even(v: f32) -> f32 {
    v.round_ties_even()
}

/// int8 code of a quotient: round half to even, clamp to [-127, 127].
pub fn int8_encode(v: f32) -> i8 {
    round_half_even(v).clamp(-INT8_QMAX, INT8_QMAX) as i8
}

/// int4 code of a quotient: round half to even, clamp to [-8, 7].
pub fn int4_encode(v: f32) -> i8 {
    round_half_even(v).clamp(-8.0, INT4_QMAX) as i8
}

/// Encodes an f32 as fp8 e4m3 ("fn": no infinities, max 448), rounding to nearest even and
/// saturating at ±448. NaN becomes 0x7F. The sign bit is set for negative inputs (including those
/// that round to zero) and clear for +0 and -0, exactly as the kernels do.
pub fn f32_to_e4m3(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7F;
    }
    let sign: u8 = if v < 0.0 { 0x80 } else { 0 };
    let a = v.abs().min(FP8_QMAX);
    let code = if a < 0.015625 {
        // Subnormal range: multiples of 2^-9; rounding up to 8 gives the smallest normal.
        round_half_even(a * 512.0) as u32
    } else {
        let bits = a.to_bits();
        let r = bits + 0x7FFFF + ((bits >> 20) & 1);
        (r >> 20) - (120 << 3)
    };
    sign | code as u8
}
