//! The dequantizing epilogue shared by the three kernels: `acc · sa · sb (+ bias) (+ residual)`,
//! rounded once to the output dtype.

use cubecl::prelude::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EpiloguePlan {
    pub fp8: bool,
    pub sa_scalar: bool,
    pub sb_scalar: bool,
    pub has_bias: bool,
    pub has_residual: bool,
}

/// The dequantizing epilogue for one output element of an `[M, n]` output.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn epilogue<F: Float>(
    acc: f32,
    row: usize,
    col: usize,
    n: usize,
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    #[comptime] plan: EpiloguePlan,
) -> F {
    let a = if comptime![plan.sa_scalar] {
        sa[0]
    } else {
        sa[row]
    };
    epilogue_scaled::<F>(acc * a, row, col, n, sb, bias, residual, plan)
}

/// The epilogue after the activation scale: `acc_a · sb[col] (+ bias[col]) (+ residual[row, col])`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn epilogue_scaled<F: Float>(
    acc_a: f32,
    row: usize,
    col: usize,
    n: usize,
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    #[comptime] plan: EpiloguePlan,
) -> F {
    let b = if comptime![plan.sb_scalar] {
        sb[0]
    } else {
        sb[col]
    };
    let mut y = acc_a * b;
    if comptime![plan.has_bias] {
        y += f32::cast_from(bias[col]);
    }
    if comptime![plan.has_residual] {
        y += f32::cast_from(residual[row * n + col]);
    }
    F::cast_from(y)
}
