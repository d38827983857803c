//! 8-bit codes read as 32-bit words (four codes each, K contiguous): masking the bytes past K,
//! and the 16-byte loads of the tensor-core kernels.

use cubecl::prelude::*;

/// Keeps the bytes of word `w` (starting at byte `start` of its row) that lie before `k`.
#[cube]
pub(crate) fn mask_word(w: i32, start: usize, k: usize) -> i32 {
    let mut out = w;
    if start + 4 > k {
        let mut valid = 0usize;
        if start < k {
            valid = k - start;
        }
        let mask = (1u32 << (8 * valid) as u32) - 1u32;
        out = i32::reinterpret(u32::reinterpret(w) & mask);
    }
    out
}

/// Loads 16 bytes of row `row` at byte `byte` (zeros past the matrix, bytes past K masked: an
/// fp8 padding byte could be a NaN code).
#[cube]
pub(super) fn load_vec(
    src: &[Vector<i32, Const<4>>],
    row: usize,
    valid: bool,
    byte: usize,
    k: usize,
    pitch_vecs: usize,
) -> Vector<i32, Const<4>> {
    let mut val = Vector::<i32, Const<4>>::new(0i32);
    if valid && byte < k {
        val = src[row * pitch_vecs + byte / 16];
        if byte + 16 > k {
            #[unroll]
            for i in 0..4usize {
                val.insert(i, mask_word(val.extract(i), byte + 4 * i, k));
            }
        }
    }
    val
}
