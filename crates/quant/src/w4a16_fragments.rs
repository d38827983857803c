//! The pieces the int4 tensor-core kernels (the decode GEMV `crate::w4a16_mma` and the prefill
//! GEMM `crate::w4a16_gemm`) share: `mma.sync.m16n8k16` on packed bf16 (f16) pairs with f32
//! accumulators, two int4 nibbles as an exact bf16 (f16) pair, and two activations packed as one.

use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;
use ops::DType;

/// Whether the runtime runs `mma.sync.m16n8k16` on `dtype` (bf16 or f16) with f32 accumulators.
pub(crate) fn has_mma16<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    let t = match dtype {
        DType::BF16 => ElemType::Float(FloatKind::BF16),
        DType::F16 => ElemType::Float(FloatKind::F16),
        _ => return false,
    };
    crate::gemm8::has_warp_mma(client, t, ElemType::Float(FloatKind::F32), 16)
}

/// `mma.sync.m16n8k16` with f32 accumulators on packed bf16 (f16) pairs.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_m16n8k16(
    a0: u32,
    a1: u32,
    a2: u32,
    a3: u32,
    b0: u32,
    b1: u32,
    c: Vector<f32, Const<4>>,
    #[comptime] f16: bool,
) -> Vector<f32, Const<4>> {
    let d: Vector<f32, Const<4>>;
    if comptime![f16] {
        gpu_asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {c};",
            a0 = in(_) a0,
            a1 = in(_) a1,
            a2 = in(_) a2,
            a3 = in(_) a3,
            b0 = in(_) b0,
            b1 = in(_) b1,
            c = in(_) c,
            d = out(_) d,
            options(pure, nomem),
        );
    } else {
        gpu_asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {c};",
            a0 = in(_) a0,
            a1 = in(_) a1,
            a2 = in(_) a2,
            a3 = in(_) a3,
            b0 = in(_) b0,
            b1 = in(_) b1,
            c = in(_) c,
            d = out(_) d,
            options(pure, nomem),
        );
    }
    d
}

/// Nibbles `p` and `p + 4` of `word` (two's complement, `-8..=7`) as an exact bf16 (f16) pair,
/// the first in the low half: `(word >> 4p) & 0x000F000F ^ magic` (one LOP3, written out in PTX
/// because the compiler otherwise splits it into two, an instruction takes one immediate) puts
/// each nibble, its sign bit flipped (`n + 8`), in the units of a float whose value is then
/// `136 + n` (bf16, exponent 2^7) or `1032 + n` (f16, 2^10), from which one packed FMA subtracts
/// 136 (1032). `biased` (bf16 only): the pair stays `136 + n`, the caller takes the offset off its
/// sums (see the GEMV's plan in `crate::w4a16_mma`).
#[cube]
pub(crate) fn nibble_pair(
    word: i32,
    #[comptime] p: u32,
    #[comptime] f16: bool,
    #[comptime] biased: bool,
) -> u32 {
    let u = u32::reinterpret(word);
    let shifted = if comptime![p == 0] {
        u
    } else {
        u >> comptime![4 * p]
    };
    let mask = 0x000F_000Fu32;
    let d: u32;
    if comptime![f16] {
        let magic = 0x6408_6408u32;
        let one = 0x3C00_3C00u32;
        let minus = 0xE408_E408u32;
        gpu_asm!(
            "{{ .reg .b32 t; lop3.b32 t, {a}, {mask}, {magic}, 0x6a; fma.rn.f16x2 {d}, t, {one}, {minus}; }}",
            a = in(_) shifted,
            mask = in(_) mask,
            magic = in(_) magic,
            one = in(_) one,
            minus = in(_) minus,
            d = out(_) d,
            options(pure, nomem),
        );
    } else if comptime![biased] {
        let magic = 0x4308_4308u32;
        gpu_asm!(
            "lop3.b32 {d}, {a}, {mask}, {magic}, 0x6a;",
            a = in(_) shifted,
            mask = in(_) mask,
            magic = in(_) magic,
            d = out(_) d,
            options(pure, nomem),
        );
    } else {
        let magic = 0x4308_4308u32;
        let one = 0x3F80_3F80u32;
        let minus = 0xC308_C308u32;
        gpu_asm!(
            "{{ .reg .b32 t; lop3.b32 t, {a}, {mask}, {magic}, 0x6a; fma.rn.bf16x2 {d}, t, {one}, {minus}; }}",
            a = in(_) shifted,
            mask = in(_) mask,
            magic = in(_) magic,
            one = in(_) one,
            minus = in(_) minus,
            d = out(_) d,
            options(pure, nomem),
        );
    }
    d
}

/// `lo` and `hi` (values of the activation dtype, so exact) packed as a bf16 (f16) pair, `lo` in
/// the low half.
#[cube]
pub(crate) fn pack_pair(lo: f32, hi: f32, #[comptime] f16: bool) -> u32 {
    let d: u32;
    if comptime![f16] {
        gpu_asm!(
            "cvt.rn.f16x2.f32 {d}, {hi}, {lo};",
            hi = in(_) hi,
            lo = in(_) lo,
            d = out(_) d,
            options(pure, nomem),
        );
    } else {
        gpu_asm!(
            "cvt.rn.bf16x2.f32 {d}, {hi}, {lo};",
            hi = in(_) hi,
            lo = in(_) lo,
            d = out(_) d,
            options(pure, nomem),
        );
    }
    d
}
