//! The warp-level `mma.sync.m16n8k32` of both tensor-core kernels, issued as inline PTX.

use cubecl::prelude::*;

/// One warp-level `mma.sync.m16n8k32` on 8-bit codes packed four per register. Operands are
/// scalars, not vectors: CubeCL 0.11.0-pre.3 hands a *mutable* vector variable to inline PTX
/// by its address (a 64-bit operand, which `mma` rejects with "Arguments mismatch").
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_m16n8k32<Acc: Numeric>(
    a0: i32,
    a1: i32,
    a2: i32,
    a3: i32,
    b0: i32,
    b1: i32,
    c: Vector<Acc, Const<4>>,
    #[comptime] fp8: bool,
) -> Vector<Acc, Const<4>> {
    let d: Vector<Acc, Const<4>>;
    if comptime![fp8] {
        gpu_asm!(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {c};",
            a0 = in(_) a0,
            a1 = in(_) a1,
            a2 = in(_) a2,
            a3 = in(_) a3,
            b0 = in(_) b0,
            b1 = in(_) b1,
            c = in(_) c,
            d = out(_) d,
            options(nomem),
        );
    } else {
        gpu_asm!(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {c};",
            a0 = in(_) a0,
            a1 = in(_) a1,
            a2 = in(_) a2,
            a3 = in(_) a3,
            b0 = in(_) b0,
            b1 = in(_) b1,
            c = in(_) c,
            d = out(_) d,
            options(nomem),
        );
    }
    d
}
