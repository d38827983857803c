//! The device layouts of quantized operands and their validation.
//!
//! 8-bit matrices (int8, fp8) are `[rows, cols]` tensors with strides `[pitch, 1]` where the row
//! pitch in bytes is a multiple of 16 ([`crate::format::row_pitch`]): the kernels read them as
//! 32-bit words (WGSL has no 8-bit loads) and, on CUDA, with 16-byte loads. A contiguous matrix
//! whose row length is a multiple of 16 already has that layout; others are built padded by
//! [`empty_byte_matrix`], [`crate::host::ByteMatrix::upload`] and the quantize kernels.

use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor, OpsError, Result};

use crate::format::row_pitch;

/// An uninitialised `[rows, cols]` 8-bit matrix of `dtype` with the padded layout.
pub fn empty_byte_matrix<R: Runtime>(
    client: &ComputeClient<R>,
    rows: usize,
    cols: usize,
    dtype: DType,
) -> DeviceTensor<R> {
    let pitch = row_pitch(cols);
    let handle = client.empty((rows * pitch).max(16));
    DeviceTensor::from_parts(handle, &[rows, cols], &[pitch, 1], dtype)
}

/// Checks that `t` is an 8-bit matrix of `dtype` in the padded layout; returns its pitch.
pub fn check_byte_matrix<R: Runtime>(
    op: &'static str,
    what: &str,
    t: &DeviceTensor<R>,
    dtype: DType,
) -> Result<usize> {
    if t.dtype() != dtype {
        return Err(OpsError::UnsupportedDType {
            op,
            dtype: t.dtype(),
            runtime: "any",
            detail: format!("{what} must be {dtype}"),
        });
    }
    if t.rank() != 2 || t.numel() == 0 {
        return Err(OpsError::shape(
            op,
            format!(
                "{what} must be a non-empty [rows, cols] matrix, got {:?}",
                t.shape()
            ),
        ));
    }
    let (rows, cols) = (t.shape()[0], t.shape()[1]);
    let (pitch, inner) = (t.strides()[0], t.strides()[1]);
    if inner != 1 || (rows > 1 && (pitch < cols || pitch % 16 != 0)) {
        return Err(OpsError::shape(
            op,
            format!(
                "{what} {:?} has strides {:?}: 8-bit matrices need unit column stride and a row \
                 pitch that is a multiple of 16 bytes (build them with quant::layout::\
                 empty_byte_matrix, quant::host::ByteMatrix or the quantize ops)",
                t.shape(),
                t.strides()
            ),
        ));
    }
    // A single row may carry any stride; the kernels then use the padded pitch of its length.
    let pitch = if rows == 1 { row_pitch(cols) } else { pitch };
    let needed = (rows - 1) * pitch + row_pitch(cols);
    let capacity = t.handle().size_in_used() as usize;
    if capacity < needed {
        return Err(OpsError::shape(
            op,
            format!(
                "{what}: a buffer of {capacity} bytes is too small for {rows} rows padded to \
                 16 bytes ({needed} bytes needed)"
            ),
        ));
    }
    Ok(pitch)
}

/// Checks a float vector of scales: f32, contiguous, `len` elements (or 1 if `allow_scalar`).
pub fn check_scales<R: Runtime>(
    op: &'static str,
    what: &str,
    s: &DeviceTensor<R>,
    len: usize,
    allow_scalar: bool,
) -> Result<bool> {
    if s.dtype() != DType::F32 {
        return Err(OpsError::UnsupportedDType {
            op,
            dtype: s.dtype(),
            runtime: "any",
            detail: format!("{what} must be f32"),
        });
    }
    if !s.is_contiguous() {
        return Err(OpsError::shape(op, format!("{what} must be contiguous")));
    }
    let n = s.numel();
    if n == len {
        Ok(len == 1)
    } else if allow_scalar && n == 1 {
        Ok(true)
    } else {
        Err(OpsError::shape(
            op,
            format!(
                "{what} has shape {:?}, expected {len} elements{}",
                s.shape(),
                if allow_scalar { " or 1" } else { "" }
            ),
        ))
    }
}

/// The buffer argument of a padded 8-bit matrix seen as 32-bit words.
///
/// # Safety
/// `t` passed [`check_byte_matrix`].
pub(crate) unsafe fn words_arg<R: Runtime>(t: &DeviceTensor<R>) -> BufferArg<R> {
    let words = t.handle().size_in_used() as usize / 4;
    unsafe { BufferArg::from_raw_parts(t.handle().clone(), words) }
}

/// Checks a float output `[.., N]` of the expected shape and its optional bias `[N]`.
pub(crate) fn check_output<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    out: &DeviceTensor<R>,
    shape: &[usize],
    bias: Option<&DeviceTensor<R>>,
) -> Result<()> {
    caps::check_float_dtype(client, op, out.dtype())?;
    if out.shape() != shape || !out.is_contiguous() {
        return Err(OpsError::shape(
            op,
            format!(
                "out must be a contiguous {shape:?}, got {:?} with strides {:?}",
                out.shape(),
                out.strides()
            ),
        ));
    }
    if let Some(b) = bias {
        let n = shape[shape.len() - 1];
        if b.dtype() != out.dtype() {
            return Err(OpsError::UnsupportedDType {
                op,
                dtype: b.dtype(),
                runtime: "any",
                detail: format!("bias must have the output's dtype {}", out.dtype()),
            });
        }
        if b.shape() != [n] || !b.is_contiguous() {
            return Err(OpsError::shape(
                op,
                format!("bias is {:?}, expected a contiguous [{n}]", b.shape()),
            ));
        }
    }
    Ok(())
}

/// The shape of a linear layer's output for input `x[.., K]`: `[.., n]`.
pub(crate) fn output_shape<R: Runtime>(x: &DeviceTensor<R>, n: usize) -> Vec<usize> {
    let mut shape = x.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = n;
    }
    shape
}
