//! Device helpers of the sampler: the order-preserving keys, the weights, and probability mass
//! in fixed point with exact integer sums.
//!
//! A mass is a pair `(h, l)` of u32: `h` in units of `2^-A` (A = the launch's `scale_bits`), `l`
//! in units of `2^-(A + FRAC_BITS)`, normalised when `l < 2^FRAC_BITS`. Integer additions are
//! associative, so a sum is the same whatever order the atomics or the scans add in: that is
//! what makes the sampler deterministic without a fixed float reduction order in every pass.

use cubecl::prelude::*;

/// Bits of the low limb of a mass.
pub(crate) const FRAC_BITS: u32 = 22;
pub(crate) const FRAC_MASK: u32 = (1 << FRAC_BITS) - 1;
/// `2^FRAC_BITS` as f32.
pub(crate) const FRAC_SCALE: f32 = (1u32 << FRAC_BITS) as f32;
/// The key of a logit that is never a candidate (NaN, `-inf`); larger than every other key.
pub(crate) const EXCLUDED: u32 = u32::MAX;

/// The descending key of a logit: a smaller key is a larger value, so the candidates in key
/// order are the logits from the largest down. `-0` is `+0` (equal values tie and the lower id
/// wins); NaN and `-inf` get [`EXCLUDED`].
#[cube]
pub(crate) fn desc_key(v: f32) -> u32 {
    let raw = u32::reinterpret(v);
    let nan = (raw & 0x7F80_0000u32) == 0x7F80_0000u32 && (raw & 0x007F_FFFFu32) != 0u32;
    let neg_inf = raw == 0xFF80_0000u32;
    let b = select(raw == 0x8000_0000u32, 0u32, raw);
    // Ascending order as an unsigned integer: negative values have every bit flipped, the
    // others only the sign bit; the descending key is its complement.
    let asc = select(
        (b & 0x8000_0000u32) != 0u32,
        b ^ 0xFFFF_FFFFu32,
        b | 0x8000_0000u32,
    );
    select(nan || neg_inf, EXCLUDED, asc ^ 0xFFFF_FFFFu32)
}

/// The logit of a key made by [`desc_key`].
#[cube]
pub(crate) fn key_value(key: u32) -> f32 {
    let asc = key ^ 0xFFFF_FFFFu32;
    let b = select(
        (asc & 0x8000_0000u32) != 0u32,
        asc & 0x7FFF_FFFFu32,
        asc ^ 0xFFFF_FFFFu32,
    );
    f32::reinterpret(b)
}

/// The unnormalised probability of the token with `key`: `exp((value - max) / temperature)`,
/// exactly 1 for the maximum itself (which also makes `+inf` logits well defined).
#[cube]
pub(crate) fn weight(key: u32, t_max: u32, temperature: f32) -> f32 {
    let mut w = 1f32;
    if key != t_max {
        w = f32::exp((key_value(key) - key_value(t_max)) / temperature);
    }
    w
}

/// A weight in `[0, 1]` as a mass, rounded to the nearest unit of the low limb (`scale` is
/// `2^A`). Every step is exact in f32 except that rounding.
#[cube]
pub(crate) fn fixed_of(w: f32, scale: f32) -> (u32, u32) {
    let x = w * scale;
    let hi = f32::floor(x);
    let lo = f32::floor((x - hi) * FRAC_SCALE + 0.5f32);
    let mut h = u32::cast_from(hi);
    let mut l = u32::cast_from(lo);
    if l > FRAC_MASK {
        h += 1u32;
        l = 0u32;
    }
    (h, l)
}

/// The mass of the token with `key` (see [`weight`], [`fixed_of`]).
#[cube]
pub(crate) fn mass_of(key: u32, t_max: u32, temperature: f32, scale: f32) -> (u32, u32) {
    fixed_of(weight(key, t_max, temperature), scale)
}

/// Moves the carries of `l` into `h` (`l` may be any u32).
#[cube]
pub(crate) fn normalize(h: u32, l: u32) -> (u32, u32) {
    (h + (l >> FRAC_BITS), l & FRAC_MASK)
}

/// `a + b` of normalised masses.
#[cube]
pub(crate) fn mass_add(ah: u32, al: u32, bh: u32, bl: u32) -> (u32, u32) {
    normalize(ah + bh, al + bl)
}

/// `a - b` of normalised masses, `a >= b`.
#[cube]
pub(crate) fn mass_sub(ah: u32, al: u32, bh: u32, bl: u32) -> (u32, u32) {
    let mut h = ah - bh;
    let mut l = al;
    if al < bl {
        h -= 1u32;
        l += 1u32 << FRAC_BITS;
    }
    (h, l - bl)
}

/// `a < b` of normalised masses.
#[cube]
pub(crate) fn mass_lt(ah: u32, al: u32, bh: u32, bl: u32) -> bool {
    ah < bh || (ah == bh && al < bl)
}

/// `j * q` of a normalised mass exactly (`j < 2^20` and the product below `2^32` units of `h`).
#[cube]
pub(crate) fn mass_mul(qh: u32, ql: u32, j: u32) -> (u32, u32) {
    // l = l1 * 2^11 + l0 keeps each partial product below 2^31.
    let a = j * (ql >> 11u32);
    let b = j * (ql & 2047u32);
    let h = qh * j + (a >> 11u32) + (b >> FRAC_BITS);
    normalize(h, ((a & 2047u32) << 11u32) + (b & FRAC_MASK))
}

/// A normalised mass as f32 (in units of `h`).
#[cube]
pub(crate) fn mass_to_f32(h: u32, l: u32) -> f32 {
    f32::cast_from(h) + f32::cast_from(l) * (1f32 / FRAC_SCALE)
}

/// A non-negative f32 below `2^32` as a normalised mass (truncated).
#[cube]
pub(crate) fn mass_from_f32(x: f32) -> (u32, u32) {
    let hi = f32::floor(x);
    let lo = f32::floor((x - hi) * FRAC_SCALE);
    normalize(u32::cast_from(hi), u32::cast_from(lo))
}

/// The minimum of `v` over the cube's units, returned to every unit (a shared-memory tree:
/// WGSL's integer atomics are only reported for load, store and add). `s` holds one u32 per
/// unit. Every unit must call it.
#[cube]
pub(crate) fn cube_min_u32(v: u32, s: &mut [u32], #[comptime] units: u32) -> u32 {
    let u = UNIT_POS as usize;
    sync_cube();
    s[u] = v;
    sync_cube();
    #[unroll]
    for step in 0..comptime![units.trailing_zeros()] {
        let d = comptime![(units >> (step + 1)) as usize];
        if u < d {
            s[u] = min(s[u], s[u + d]);
        }
        sync_cube();
    }
    s[0]
}

/// The exclusive prefix sums over the cube's units of three u32 values (in unit order), and
/// their totals: `(ea, eb, ec, ta, tb, tc)`. Integer sums, so the result is exact; the caller
/// keeps every partial sum below 2^32. `sa`, `sb`, `sc` hold one u32 per unit. Every unit must
/// call it.
#[cube]
pub(crate) fn scan3(
    a: u32,
    b: u32,
    c: u32,
    sa: &mut [u32],
    sb: &mut [u32],
    sc: &mut [u32],
    #[comptime] units: u32,
) -> (u32, u32, u32, u32, u32, u32) {
    let u = UNIT_POS as usize;
    sync_cube();
    sa[u] = a;
    sb[u] = b;
    sc[u] = c;
    sync_cube();
    #[unroll]
    for step in 0..comptime![units.trailing_zeros()] {
        let d = comptime![1usize << step];
        let mut xa = 0u32;
        let mut xb = 0u32;
        let mut xc = 0u32;
        if u >= d {
            xa = sa[u - d];
            xb = sb[u - d];
            xc = sc[u - d];
        }
        sync_cube();
        sa[u] += xa;
        sb[u] += xb;
        sc[u] += xc;
        sync_cube();
    }
    let last = comptime![(units - 1) as usize];
    (
        sa[u] - a,
        sb[u] - b,
        sc[u] - c,
        sa[last],
        sb[last],
        sc[last],
    )
}
