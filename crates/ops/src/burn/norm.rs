//! RMSNorm and RoPE on Burn primitives.

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::{from_device_tensor, operand, to_device_tensor};
use crate::rope::RopeCache;
use crate::Result;

/// [`crate::norm::rms_norm`] on Burn primitives: each row of `x[.., K]` normalised over its last
/// dimension, `x * rsqrt(mean(x²) + eps) * weight`, with `weight[K]` of x's dtype (f32, f16 or
/// bf16). Output: x's shape and dtype. Non-contiguous inputs are copied to contiguous first.
pub fn rms_norm<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> Result<CubeTensor<R>> {
    const OP: &str = "rms_norm";
    let (xd, x) = to_device_tensor(OP, x)?;
    let wd = operand(OP, &x, weight)?;
    let out = crate::norm::rms_norm(&x.client, &xd, &wd, eps)?;
    Ok(from_device_tensor(out, &x))
}

/// [`crate::norm::rms_norm_residual`] on Burn primitives: `sum = x + residual`, then
/// `rms_norm(sum, weight, eps)`, in one kernel. Returns `(normed, sum)`, both of x's shape and
/// dtype: the pre-norm block's normalised input and its next residual stream.
///
/// `x` and `residual` `[.., K]` of one shape, `weight[K]`, all f32, f16 or bf16 of one dtype.
/// Non-contiguous inputs are copied to contiguous first.
pub fn rms_norm_residual<R: CubeRuntime>(
    x: CubeTensor<R>,
    residual: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> Result<(CubeTensor<R>, CubeTensor<R>)> {
    const OP: &str = "rms_norm_residual";
    let (xd, x) = to_device_tensor(OP, x)?;
    let rd = operand(OP, &x, residual)?;
    let wd = operand(OP, &x, weight)?;
    let (normed, sum) = crate::norm::rms_norm_residual(&x.client, &xd, &rd, &wd, eps)?;
    Ok((from_device_tensor(normed, &x), from_device_tensor(sum, &x)))
}

/// [`crate::rope::fused_rmsnorm_rope`] on Burn primitives: `x[b, s, h]`, `weight[h]`, `cos` and
/// `sin` of shape `[s, head_dim]` or `[1, s, 1, head_dim]` (Hugging Face's full-width tables, in
/// x's dtype); `num_heads` inferred as `h / head_dim` when `None`. Output: x's shape and dtype.
/// Non-contiguous inputs are copied to contiguous first.
pub fn fused_rmsnorm_rope<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    cos: CubeTensor<R>,
    sin: CubeTensor<R>,
    eps: f32,
    num_heads: Option<usize>,
) -> Result<CubeTensor<R>> {
    const OP: &str = "fused_rmsnorm_rope";
    let (xd, x) = to_device_tensor(OP, x)?;
    let wd = operand(OP, &x, weight)?;
    let cd = operand(OP, &x, cos)?;
    let sd = operand(OP, &x, sin)?;
    let out = crate::rope::fused_rmsnorm_rope(&x.client, &xd, &wd, &cd, &sd, eps, num_heads)?;
    Ok(from_device_tensor(out, &x))
}

/// [`crate::rope::rope_host_positions`] on a Burn primitive: rotary embedding of `x[T, H, D]`
/// (f32, f16 or bf16; `D` = `cache.head_dim`), token `t` of every head rotated by the angles of
/// position `positions[t]`, Hugging Face's pairing `(x[i], x[i + D/2])` (`rotate_half`).
///
/// Positions are given on the host, one per token (`positions.len() == T`; a prompt starting at
/// `p0` has `p0..p0 + T`), checked against the cache (a position at or past
/// `cache.max_positions()` is an [`crate::OpsError::InvalidArgument`]) and uploaded per call.
/// `cache` holds the f32 cos/sin tables ([`RopeCache::new`]), made on the client of x's device
/// (`R::client(&device)`). Output: x's shape and dtype. A non-contiguous `x` is copied to
/// contiguous first.
pub fn rope<R: CubeRuntime>(
    x: CubeTensor<R>,
    positions: &[u32],
    cache: &RopeCache<R>,
) -> Result<CubeTensor<R>> {
    let (xd, x) = to_device_tensor("rope", x)?;
    let out = crate::rope::rope_host_positions(&x.client, &xd, positions, cache)?;
    Ok(from_device_tensor(out, &x))
}
