//! Our kernels as ops on Burn tensors (feature `burn`).
//!
//! Targets the plain `burn_cubecl::CubeBackend<R>` (Burn 0.22.0-pre.3), whose float tensor
//! primitive is `CubeTensor<R>`: the op takes the primitive, makes it contiguous, runs our kernel
//! on its buffer and wraps the output as a new contiguous primitive on the same client and
//! device. With Burn's `fusion` feature the primitives are fusion tensors instead; this module
//! does not cover them. Use it through `B::FloatTensorPrimitive` of `CubeBackend<R>`, e.g.
//! `ops::burn::rms_norm(x.into_primitive().tensor(), ...)` with Burn's `Tensor` API.

use burn_backend::DType as BurnDType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use crate::{DType, DeviceTensor, OpsError, Result};

fn dtype_of<R: CubeRuntime>(op: &'static str, t: &CubeTensor<R>) -> Result<DType> {
    match t.dtype {
        BurnDType::F32 => Ok(DType::F32),
        BurnDType::F16 => Ok(DType::F16),
        BurnDType::BF16 => Ok(DType::BF16),
        other => Err(OpsError::UnsupportedDType {
            op,
            dtype: DType::F32,
            runtime: "burn",
            detail: format!("Burn tensor of dtype {other:?}: expected f32, f16 or bf16"),
        }),
    }
}

fn burn_dtype(d: DType) -> BurnDType {
    match d {
        DType::F16 => BurnDType::F16,
        DType::BF16 => BurnDType::BF16,
        _ => BurnDType::F32,
    }
}

/// Views a Burn primitive as a [`DeviceTensor`] (contiguous copy first if needed).
pub fn to_device_tensor<R: CubeRuntime>(
    op: &'static str,
    t: CubeTensor<R>,
) -> Result<(DeviceTensor<R>, CubeTensor<R>)> {
    let dtype = dtype_of(op, &t)?;
    let t = if t.is_contiguous() {
        t
    } else {
        into_contiguous(t)
    };
    let shape: Vec<usize> = t.meta.shape().iter().copied().collect();
    let strides: Vec<usize> = t.meta.strides().iter().copied().collect();
    let dt = DeviceTensor::from_parts(t.handle.clone(), &shape, &strides, dtype);
    Ok((dt, t))
}

/// Wraps an output [`DeviceTensor`] as a Burn primitive on the client and device of `like`.
pub fn from_device_tensor<R: CubeRuntime>(
    out: DeviceTensor<R>,
    like: &CubeTensor<R>,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        out.shape().to_vec().into(),
        out.handle().clone(),
        burn_dtype(out.dtype()),
    )
}

/// [`crate::norm::rms_norm`] on Burn primitives: normalises over the last dimension.
pub fn rms_norm<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> Result<CubeTensor<R>> {
    let (xd, x) = to_device_tensor("rms_norm", x)?;
    let (wd, _w) = to_device_tensor("rms_norm", weight)?;
    let out = crate::norm::rms_norm(&x.client, &xd, &wd, eps)?;
    Ok(from_device_tensor(out, &x))
}

/// [`crate::rope::fused_rmsnorm_rope`] on Burn primitives: `x[b, s, h]`, `weight[h]`, `cos` and
/// `sin` of shape `[s, head_dim]` or `[1, s, 1, head_dim]` (Hugging Face's full-width tables, in
/// x's dtype); `num_heads` inferred as `h / head_dim` when `None`.
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
    let (wd, _w) = to_device_tensor(OP, weight)?;
    let (cd, _c) = to_device_tensor(OP, cos)?;
    let (sd, _s) = to_device_tensor(OP, sin)?;
    let out = crate::rope::fused_rmsnorm_rope(&x.client, &xd, &wd, &cd, &sd, eps, num_heads)?;
    Ok(from_device_tensor(out, &x))
}
