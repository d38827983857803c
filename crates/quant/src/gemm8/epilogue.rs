//! What the three kernels share besides their operand codes: one launch argument with the output,
//! its scales, the epilogue operands and the sizes ([`Gemm8Out`]), and the dequantizing epilogue
//! that writes `acc · sa · sb (+ bias) (+ residual)`, rounded once to the output dtype.

use cubecl::prelude::*;

/// The comptime shape of the epilogue (part of each kernel's compile key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EpiloguePlan {
    /// e4m3 operands (f32 accumulation), else int8 (i32 accumulation).
    pub fp8: bool,
    /// `sa` holds one scale (`sa[0]`), else one per row.
    pub sa_scalar: bool,
    /// `sb` holds one scale (`sb[0]`), else one per column.
    pub sb_scalar: bool,
    pub has_bias: bool,
    pub has_residual: bool,
    /// Gated MLP (skinny kernel only): the weight's `N` rows are `N/2` gate rows then the
    /// matching up rows, and the `[M, N/2]` output is `act(gate) * up`.
    pub gate: Option<ops::matmul::Activation>,
}

/// The buffers and sizes every kernel takes beside its operand codes: the activation scales `sa`
/// (`[M]` or `[1]`), the weight scales `sb` (`[N]` or `[1]`), `bias` `[N]` and `residual`
/// `[M, N]` in the output dtype (read only where the [`EpiloguePlan`] asks for them; bound to an
/// input otherwise), the contiguous output `out[M, N]`, and `M`, `N`, `K`.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct Gemm8Out<F: Float> {
    pub sa: Box<[f32]>,
    pub sb: Box<[f32]>,
    pub bias: Box<[F]>,
    pub residual: Box<[F]>,
    pub out: Box<[F]>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Writes output element `(row, col)` from its accumulator: `acc · sa[row] · sb[col]`
/// (`+ bias[col]`) (`+ residual[row, col]`), rounded once to `F`.
#[cube]
pub(crate) fn write_output<F: Float>(
    io: &mut Gemm8Out<F>,
    acc: f32,
    row: usize,
    col: usize,
    #[comptime] plan: EpiloguePlan,
) {
    let a = if comptime![plan.sa_scalar] {
        io.sa[0]
    } else {
        io.sa[row]
    };
    write_scaled::<F>(io, acc * a, row, col, plan);
}

/// [`write_output`] for an accumulator already multiplied by its row's activation scale (the
/// fused skinny kernel holds the scales it computed in shared memory).
#[cube]
pub(crate) fn write_scaled<F: Float>(
    io: &mut Gemm8Out<F>,
    acc_a: f32,
    row: usize,
    col: usize,
    #[comptime] plan: EpiloguePlan,
) {
    let b = if comptime![plan.sb_scalar] {
        io.sb[0]
    } else {
        io.sb[col]
    };
    let at = row * io.n + col;
    let mut y = acc_a * b;
    if comptime![plan.has_bias] {
        y += f32::cast_from(io.bias[col]);
    }
    if comptime![plan.has_residual] {
        y += f32::cast_from(io.residual[at]);
    }
    io.out[at] = F::cast_from(y);
}

/// The gated form of [`write_scaled`]: output `(row, col)` of an `[M, N/2]` output from the gate
/// accumulator (weight row `col`) and the up accumulator (row `col + N/2`), each already
/// multiplied by its row's activation scale: both dequantized (`+ bias`) and rounded to `F`, as
/// two separate linears would deliver them, then `act(gate) * up`.
#[cube]
pub(crate) fn write_gated<F: Float>(
    io: &mut Gemm8Out<F>,
    gate_a: f32,
    up_a: f32,
    row: usize,
    col: usize,
    #[comptime] plan: EpiloguePlan,
) {
    let half = io.n / 2;
    let mut sg = io.sb[0];
    let mut su = io.sb[0];
    if !comptime![plan.sb_scalar] {
        sg = io.sb[col];
        su = io.sb[col + half];
    }
    let mut g = gate_a * sg;
    let mut u = up_a * su;
    if comptime![plan.has_bias] {
        g += f32::cast_from(io.bias[col]);
        u += f32::cast_from(io.bias[col + half]);
    }
    let g = f32::cast_from(F::cast_from(g));
    let u = f32::cast_from(F::cast_from(u));
    let gelu = comptime![plan.gate == Some(ops::matmul::Activation::Gelu)];
    io.out[row * half + col] = F::cast_from(ops::gemm::activation(g, gelu) * u);
}
