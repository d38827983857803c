//! Our kernels as ops on Burn tensors (feature `burn`).
//!
//! Targets the plain `burn_cubecl::CubeBackend<R>` (Burn 0.22.0-pre.3), whose tensor primitives
//! (float and int alike) are `CubeTensor<R>`: an op takes primitives, runs our kernel on their
//! buffers and wraps the output as a new contiguous primitive on the client and device of its
//! first input. With Burn's `fusion` feature the primitives are fusion tensors instead; this
//! module does not cover them. Use it through `B::FloatTensorPrimitive` of `CubeBackend<R>`, e.g.
//! `ops::burn::rms_norm(x.into_primitive().tensor(), ...)` with Burn's `Tensor` API.
//!
//! Conventions shared by every op here:
//!
//! - **Copies.** A contiguous (row-major) input is read from its own buffer, with no copy. A
//!   non-contiguous one (a transpose, a permutation, a slice along an inner dimension, a
//!   broadcast) is first copied to a contiguous buffer by Burn's kernel; the ops' kernels address
//!   rows as `row * len` and take nothing else.
//! - **Dtypes.** Float inputs are f32, f16 or bf16 (bf16 not on wgpu), all of one dtype per call;
//!   int inputs are said per op. Anything else (an int tensor where a float one is expected, f64,
//!   a bool or quantized tensor, bf16 where the runtime lacks it) is an
//!   [`OpsError::UnsupportedDType`], checked before any copy so that no Burn kernel is launched on
//!   a dtype the runtime cannot run.
//! - **Errors.** Shapes and arguments are validated by the underlying op ([`crate::norm`],
//!   [`crate::attention`], ...) and come back as its [`OpsError`]; operands on different devices
//!   are an [`OpsError::InvalidArgument`]. Nothing here panics on a bad input.
//! - **Layouts** are the ops' own, which differ from Burn's in two places: attention takes
//!   `[.., L, H, D]` (Burn's attention `[B, H, L, D]`: pass `float_swap_dims(t, 1, 2)`, copied),
//!   and [`linear`] takes PyTorch's `[N, K]` weight (Burn's `nn::Linear` holds `[K, N]`: keep a
//!   transposed copy rather than passing `float_transpose(w)`, which is copied on every call).

mod attention;
mod matmul;
mod norm;
mod rows;

pub use attention::{attention, attention_cached, kv_cache_write};
pub use matmul::{gated_mlp, linear};
pub use norm::{fused_rmsnorm_rope, rms_norm, rms_norm_residual, rope};
pub use rows::{argmax, embedding, softmax};

use burn_backend::DType as BurnDType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::ir::{ElemType, IntKind, UIntKind};
use cubecl::prelude::*;

use crate::{caps, DType, DeviceTensor, OpsError, Result};

/// The ops dtype with the same bits, where there is one.
fn ops_dtype(d: BurnDType) -> Option<DType> {
    Some(match d {
        BurnDType::F32 => DType::F32,
        BurnDType::F16 => DType::F16,
        BurnDType::BF16 => DType::BF16,
        BurnDType::I32 => DType::I32,
        BurnDType::U32 => DType::U32,
        BurnDType::I8 => DType::I8,
        BurnDType::U8 => DType::U8,
        _ => return None,
    })
}

/// The error for a Burn dtype an op does not take. [`OpsError`] names an ops dtype, so one
/// without an analogue is reported as the nearest (the detail names the real one).
fn refused<R: CubeRuntime>(
    op: &'static str,
    client: &ComputeClient<R>,
    got: BurnDType,
    expected: &str,
) -> OpsError {
    let nearest = ops_dtype(got).unwrap_or(match got {
        BurnDType::I64 | BurnDType::I16 => DType::I32,
        BurnDType::U64 | BurnDType::U16 => DType::U32,
        BurnDType::Bool(_) => DType::U8,
        BurnDType::QFloat(_) => DType::I8,
        _ => DType::F32,
    });
    OpsError::UnsupportedDType {
        op,
        dtype: nearest,
        runtime: caps::runtime_name(client),
        detail: format!("Burn tensor of dtype {got:?}: expected {expected}"),
    }
}

/// The float dtype of `t`, checked against what the runtime can run.
fn dtype_of<R: CubeRuntime>(op: &'static str, t: &CubeTensor<R>) -> Result<DType> {
    match ops_dtype(t.dtype) {
        Some(d) if d.is_float() => {
            caps::check_float_dtype(&t.client, op, d)?;
            Ok(d)
        }
        _ => Err(refused(op, &t.client, t.dtype, "f32, f16 or bf16")),
    }
}

/// The int dtype of `t` where the ops have one (i32, u32, i8, u8); any other dtype, float and
/// the wider or narrower ints included, is refused.
fn int_dtype_of<R: CubeRuntime>(op: &'static str, t: &CubeTensor<R>) -> Result<DType> {
    match ops_dtype(t.dtype) {
        Some(d) if !d.is_float() => {
            caps::check_dtype_supported(&t.client, op, d)?;
            Ok(d)
        }
        _ => Err(refused(op, &t.client, t.dtype, "i32, u32, i8 or u8")),
    }
}

/// The cubecl element type of a Burn int dtype (`None` for the others).
fn int_elem_type(d: BurnDType) -> Option<ElemType> {
    Some(match d {
        BurnDType::I64 => ElemType::Int(IntKind::I64),
        BurnDType::I32 => ElemType::Int(IntKind::I32),
        BurnDType::I16 => ElemType::Int(IntKind::I16),
        BurnDType::I8 => ElemType::Int(IntKind::I8),
        BurnDType::U64 => ElemType::UInt(UIntKind::U64),
        BurnDType::U32 => ElemType::UInt(UIntKind::U32),
        BurnDType::U16 => ElemType::UInt(UIntKind::U16),
        BurnDType::U8 => ElemType::UInt(UIntKind::U8),
        _ => return None,
    })
}

/// Errors unless the runtime of `client` has the int dtype `d` (Burn's cast kernel needs it).
fn check_int_supported<R: CubeRuntime>(
    op: &'static str,
    client: &ComputeClient<R>,
    d: BurnDType,
) -> Result<()> {
    match int_elem_type(d) {
        Some(elem) if client.properties().supports_type(elem) => Ok(()),
        Some(_) => Err(refused(op, client, d, "an int dtype this runtime supports")),
        None => Err(refused(op, client, d, "an int dtype")),
    }
}

fn burn_dtype(d: DType) -> BurnDType {
    match d {
        DType::F32 => BurnDType::F32,
        DType::F16 => BurnDType::F16,
        DType::BF16 => BurnDType::BF16,
        DType::I32 => BurnDType::I32,
        DType::U32 => BurnDType::U32,
        DType::I8 => BurnDType::I8,
        // Burn has no fp8 e4m3: such a tensor comes back as its bytes.
        DType::U8 | DType::F8E4M3 => BurnDType::U8,
    }
}

/// Errors unless `t` lives on the device of `like` (a launch on one client cannot read another's
/// buffers).
fn check_same_device<R: CubeRuntime>(
    op: &'static str,
    like: &CubeTensor<R>,
    t: &CubeTensor<R>,
) -> Result<()> {
    if t.device != like.device {
        return Err(OpsError::invalid(
            op,
            format!(
                "operands on different devices: {:?} and {:?}",
                like.device, t.device
            ),
        ));
    }
    Ok(())
}

/// `t` made contiguous (a copy only if it is not) and viewed with the ops dtype `dtype`.
fn contiguous_view<R: CubeRuntime>(
    t: CubeTensor<R>,
    dtype: DType,
) -> (DeviceTensor<R>, CubeTensor<R>) {
    let t = if t.is_contiguous() {
        t
    } else {
        into_contiguous(t)
    };
    let shape: Vec<usize> = t.meta.shape().iter().copied().collect();
    let strides: Vec<usize> = t.meta.strides().iter().copied().collect();
    let dt = DeviceTensor::from_parts(t.handle.clone(), &shape, &strides, dtype);
    (dt, t)
}

/// Views a Burn float primitive as a [`DeviceTensor`] on the same buffer (a contiguous copy
/// first if it is not contiguous). Returns the primitive too (the copy where one was made), whose
/// client and device the op runs on.
pub fn to_device_tensor<R: CubeRuntime>(
    op: &'static str,
    t: CubeTensor<R>,
) -> Result<(DeviceTensor<R>, CubeTensor<R>)> {
    let dtype = dtype_of(op, &t)?;
    Ok(contiguous_view(t, dtype))
}

/// [`to_device_tensor`] for an int primitive of an int dtype the ops have (i32, u32, i8, u8).
pub fn int_to_device_tensor<R: CubeRuntime>(
    op: &'static str,
    t: CubeTensor<R>,
) -> Result<(DeviceTensor<R>, CubeTensor<R>)> {
    let dtype = int_dtype_of(op, &t)?;
    Ok(contiguous_view(t, dtype))
}

/// A float operand of an op whose first input is `like`: same device, then [`to_device_tensor`].
fn operand<R: CubeRuntime>(
    op: &'static str,
    like: &CubeTensor<R>,
    t: CubeTensor<R>,
) -> Result<DeviceTensor<R>> {
    check_same_device(op, like, &t)?;
    Ok(to_device_tensor(op, t)?.0)
}

/// Wraps an output [`DeviceTensor`] as a Burn primitive on the client and device of `like`.
///
/// Burn has no fp8 dtype: an fp8 e4m3 tensor comes back as u8 (its bytes).
pub fn from_device_tensor<R: CubeRuntime>(
    out: DeviceTensor<R>,
    like: &CubeTensor<R>,
) -> CubeTensor<R> {
    let shape = out.shape().to_vec();
    let dtype = burn_dtype(out.dtype());
    wrap(out, &shape, dtype, like)
}

/// The contiguous buffer of `out` as a Burn primitive of `shape` (same element count) and `dtype`
/// (same element size), on the client and device of `like`.
fn wrap<R: CubeRuntime>(
    out: DeviceTensor<R>,
    shape: &[usize],
    dtype: BurnDType,
    like: &CubeTensor<R>,
) -> CubeTensor<R> {
    debug_assert!(out.is_contiguous());
    debug_assert_eq!(shape.iter().product::<usize>(), out.numel());
    debug_assert_eq!(dtype.size(), out.dtype().size());
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape.to_vec().into(),
        out.into_tensor_handle().handle,
        dtype,
    )
}
