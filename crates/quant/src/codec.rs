//! Device-side encoders and decoders of the 8-bit and 4-bit codes, written with integer and f32
//! operations only so that every runtime computes the same bits: WGSL has no 8-bit types (8-bit
//! data travels as u32/i32 words, four codes per word, lowest byte first), and CUDA's native fp8
//! conversion would be a second rounding implementation to keep in step with the host's. These
//! mirror [`crate::format`] exactly; the tests compare them bit for bit.

use cubecl::prelude::*;

/// 1.5 · 2^23. Adding it to an f32 of magnitude below 2^22 rounds the sum to an integer, half
/// to even under IEEE round-to-nearest-even (PTX's default for `add.f32`, and what GPUs do for
/// f32 additions under Vulkan, Metal and D3D; the rowquant tests compare the codes with the
/// host's bit for bit on each runtime they run on), and leaves that integer in the low bits of
/// the sum's mantissa in two's complement: the low byte is the integer's code. So an encoder
/// rounds with one addition and one mask, where rounding with `floor` takes a tie test and a
/// float-to-int conversion, and the code another conversion (conversions run at a quarter of
/// the FMA rate or less): in a one-cube quantization pass over an 8 960-element row that
/// encoding came to about a third of the pass by a count of instructions.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// int8 code (as the low byte of a u32) of the quotient `v = x / s`: `v` rounded half to even
/// and clamped to ±127 (NaN gives 0, as on the host).
#[cube]
pub fn encode_int8(v: f32) -> u32 {
    // Clamping first gives the same code (the bounds are integers) and keeps the sum exact.
    let c = u32::reinterpret(f32::clamp(v, -127.0, 127.0) + ROUND_MAGIC) & 0xFF;
    select(f32::is_nan(v), 0u32, c)
}

/// fp8 e4m3 code (as the low byte of a u32) of `v`: saturate at ±448, round to nearest even.
#[cube]
pub fn encode_e4m3(v: f32) -> u32 {
    let a = f32::min(f32::abs(v), 448.0);
    let sign = select(v < 0.0, 0x80u32, 0u32);
    let bits = u32::reinterpret(a);
    let normal = ((bits + 0x7FFFFu32 + ((bits >> 20) & 1u32)) >> 20) - 960u32;
    // Below 2^-6 the codes are multiples of 2^-9: `a · 512` (exact) rounded, 0 to 8.
    let sub = u32::reinterpret(a * 512.0 + ROUND_MAGIC) & 0xFFu32;
    select(a < 0.015625, sub, normal) | sign
}

/// Decodes the e4m3 code in the low byte of `c` (the NaN codes are never produced and decode to
/// ±480).
#[cube]
pub fn decode_e4m3(c: u32) -> f32 {
    let e = (c >> 3) & 0xFu32;
    let m = c & 7u32;
    let normal = f32::reinterpret(((e + 120u32) << 23) | (m << 20));
    let sub = f32::cast_from(m) * 0.001953125;
    let mag = select(e == 0u32, sub, normal);
    select((c & 0x80u32) != 0u32, -mag, mag)
}

/// Byte `j` (0..4) of `w`, sign-extended.
#[cube]
pub fn sext_byte(w: i32, #[comptime] j: u32) -> i32 {
    (w << comptime![(24 - 8 * j) as i32]) >> 24i32
}

/// Nibble `j` (0..8) of `w`, sign-extended.
#[cube]
pub fn sext_nibble(w: i32, j: i32) -> i32 {
    (w << (28i32 - 4i32 * j)) >> 28i32
}

/// Nibble `j` (0..8) of `w` as an exact f32 (`-8..=7`), in one bitwise operation and one
/// subtraction: the nibble, its sign bit flipped (offset binary, `n + 8`), becomes the low
/// mantissa bits of a float whose exponent makes them its units (`2^(23 - 4i) + n + 8` for the
/// nibble at bits `4i..4i + 4` of the word's low or high half), and subtracting that float's
/// value at `n = 0` leaves `n`. The mask, the flip and the exponent are one `(w & mask) ^ magic`
/// (a single LOP3 on CUDA). Same value as `f32::cast_from(sext_nibble(w, j))` without the
/// int-to-float conversion (a quarter of the FMA rate) or a shift per nibble, which made the
/// int4 GEMV ALU-bound.
#[cube]
pub fn nibble_exact(w: i32, #[comptime] j: u32) -> f32 {
    let u = u32::reinterpret(w);
    let half = if comptime![j >= 4] { u >> 16u32 } else { u };
    let i = comptime![j % 4];
    let mask = comptime![0xFu32 << (4 * i)];
    let magic = comptime![((150 - 4 * i) << 23) | (8u32 << (4 * i))];
    f32::reinterpret((half & mask) ^ magic) - f32::reinterpret(magic)
}

/// Byte `j` (0..4) of `w` as an exact f32 (`-128..=127`), in one bitwise operation and one
/// subtraction, as [`nibble_exact()`] does for nibbles: the byte, its sign bit flipped (offset
/// binary, `c + 128`), becomes the low mantissa bits of a float whose exponent makes them its
/// units (`2^23` for the byte at bits 0..8 of the word's low or high half, `2^15` at bits 8..16),
/// and subtracting that float's value at `c = 0` leaves `c`. Same value as
/// `f32::cast_from(sext_byte(w, j))` without the int-to-float conversion.
#[cube]
pub fn byte_exact(w: i32, #[comptime] j: u32) -> f32 {
    let u = u32::reinterpret(w);
    let half = if comptime![j >= 2] { u >> 16u32 } else { u };
    let i = comptime![j % 2];
    let mask = comptime![0xFFu32 << (8 * i)];
    let magic = comptime![((150 - 8 * i) << 23) | (0x80u32 << (8 * i))];
    f32::reinterpret((half & mask) ^ magic) - f32::reinterpret(magic)
}
