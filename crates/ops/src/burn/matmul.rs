//! The dense products on Burn primitives: `linear` with its epilogues, the fused gated MLP.

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::{from_device_tensor, operand, to_device_tensor};
use crate::matmul::{Activation, GatedWeights};
use crate::Result;

/// [`crate::matmul::linear`] on Burn primitives: `y = x·weightᵀ (+ bias) (+ residual)`, the bias
/// and residual added in the product's epilogue (f32 accumulation, one rounding to the dtype).
///
/// `x[.., K]`; `weight[N, K]`, PyTorch's layout (one row per output feature). Burn's `nn::Linear`
/// holds its weight as `[K, N]`: its `float_transpose` works but is copied on every call, so keep
/// a transposed copy for repeated use. `bias[N]`, `residual[.., N]` (the output's shape). One
/// float dtype (f32, f16 or bf16) for all. Output: `[.., N]` in x's dtype. Non-contiguous inputs
/// are copied to contiguous first.
pub fn linear<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: Option<CubeTensor<R>>,
    residual: Option<CubeTensor<R>>,
) -> Result<CubeTensor<R>> {
    const OP: &str = "linear";
    let (xd, x) = to_device_tensor(OP, x)?;
    let wd = operand(OP, &x, weight)?;
    let bd = bias.map(|b| operand(OP, &x, b)).transpose()?;
    let rd = residual.map(|r| operand(OP, &x, r)).transpose()?;
    let out = crate::matmul::linear(&x.client, &xd, &wd, bd.as_ref(), rd.as_ref())?;
    Ok(from_device_tensor(out, &x))
}

/// [`crate::matmul::fused_gated_mlp`] on Burn primitives: `act(x·gateᵀ) * (x·upᵀ)` in one kernel
/// (the gated MLP's first half; SwiGLU with [`Activation::Silu`]).
///
/// `x[.., H]`, `gate[I, H]` and `up[I, H]` (PyTorch's layout, as in [`linear`]), one float dtype.
/// Output: `[.., I]` in x's dtype. Non-contiguous inputs are copied to contiguous first.
pub fn gated_mlp<R: CubeRuntime>(
    x: CubeTensor<R>,
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
    act: Activation,
) -> Result<CubeTensor<R>> {
    const OP: &str = "fused_gated_mlp";
    let (xd, x) = to_device_tensor(OP, x)?;
    let gd = operand(OP, &x, gate)?;
    let ud = operand(OP, &x, up)?;
    let weights = GatedWeights::Separate { gate: &gd, up: &ud };
    let out = crate::matmul::fused_gated_mlp(&x.client, &xd, weights, act)?;
    Ok(from_device_tensor(out, &x))
}
