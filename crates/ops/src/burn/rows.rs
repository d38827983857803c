//! Row-wise ops on Burn primitives: the embedding gather, softmax and argmax.

use burn_backend::{DType as BurnDType, IntDType};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::{
    check_int_supported, check_same_device, from_device_tensor, int_to_device_tensor, refused,
    to_device_tensor, wrap,
};
use crate::{DeviceTensor, OpsError, Result};

/// [`crate::embedding::embedding`] on Burn primitives: the rows of `table[V, H]` (f32, f16 or
/// bf16) picked by `ids`, a Burn int primitive of any shape `[..]` (e.g. `[B, S]`); output
/// `[.., H]` (ids' shape, then H) in the table's dtype.
///
/// i32 ids (Burn's default int dtype) and u32 ids are read as they are; i64, i16, i8, u64, u16 and
/// u8 ids are converted to i32 first (a copy; ids must then fit in i32). Any other dtype (a float
/// or bool tensor) is an [`OpsError::UnsupportedDType`], as is an int dtype the runtime lacks.
/// Ids outside `[0, V)` are clamped to row `V - 1` by the kernel (they live on the device:
/// checking them would cost a read back). Non-contiguous inputs are copied to contiguous first.
pub fn embedding<R: CubeRuntime>(
    table: CubeTensor<R>,
    ids: CubeTensor<R>,
) -> Result<CubeTensor<R>> {
    const OP: &str = "embedding";
    let (td, table) = to_device_tensor(OP, table)?;
    check_same_device(OP, &table, &ids)?;
    let ids = match ids.dtype {
        BurnDType::I32 | BurnDType::U32 => ids,
        d @ (BurnDType::I64
        | BurnDType::I16
        | BurnDType::I8
        | BurnDType::U64
        | BurnDType::U16
        | BurnDType::U8) => {
            check_int_supported(OP, &ids.client, d)?;
            check_int_supported(OP, &ids.client, BurnDType::I32)?;
            burn_cubecl::kernel::cast(ids, BurnDType::I32)
        }
        other => {
            return Err(refused(
                OP,
                &ids.client,
                other,
                "an int tensor of token ids",
            ))
        }
    };
    let mut out_shape: Vec<usize> = ids.meta.shape().iter().copied().collect();
    let (idd, _ids) = int_to_device_tensor(OP, ids)?;
    // The kernel takes the ids as one row; a contiguous tensor of any rank is that row.
    let flat = idd.reshape(&[idd.numel()])?;
    let out = crate::embedding::embedding(&table.client, &td, &flat)?;
    out_shape.push(td.last_dim());
    let dtype = table.dtype;
    Ok(wrap(out, &out_shape, dtype, &table))
}

/// [`crate::softmax::softmax`] on a Burn primitive: softmax over the last dimension of `x[.., n]`
/// (f32, f16 or bf16; statistics in f32). Output: x's shape and dtype. A non-contiguous `x` is
/// copied to contiguous first.
pub fn softmax<R: CubeRuntime>(x: CubeTensor<R>) -> Result<CubeTensor<R>> {
    let (xd, x) = to_device_tensor("softmax", x)?;
    let out = crate::softmax::softmax(&x.client, &xd)?;
    Ok(from_device_tensor(out, &x))
}

/// [`crate::argmax::argmax`] on a Burn primitive, shaped as Burn's
/// `float_argmax(x, last_dim, out_dtype)`: the index of the largest element of each row of
/// `x[.., n]` (f32, f16 or bf16), as an int primitive of x's shape with the last dimension 1.
/// First index on ties; NaN is never chosen (a row of only NaN gives 0).
///
/// The kernel writes u32: `out_dtype` u32 is its output as it is, and so is i32 (indices below
/// 2³¹ have the same bits); the other int dtypes are converted (a copy). An `out_dtype` too narrow
/// for the row's indices (u8 for rows longer than 256, ...) is an [`OpsError::InvalidArgument`];
/// one the runtime lacks, an [`OpsError::UnsupportedDType`]. A non-contiguous `x` is copied to
/// contiguous first.
pub fn argmax<R: CubeRuntime>(x: CubeTensor<R>, out_dtype: IntDType) -> Result<CubeTensor<R>> {
    const OP: &str = "argmax";
    let (xd, x) = to_device_tensor(OP, x)?;
    let target = BurnDType::from(out_dtype);
    let largest = match out_dtype {
        IntDType::I8 => i8::MAX as u64,
        IntDType::U8 => u8::MAX as u64,
        IntDType::I16 => i16::MAX as u64,
        IntDType::U16 => u16::MAX as u64,
        IntDType::I32 => i32::MAX as u64,
        IntDType::U32 => u32::MAX as u64,
        IntDType::I64 | IntDType::U64 => u64::MAX,
    };
    if xd.last_dim().saturating_sub(1) as u64 > largest {
        return Err(OpsError::invalid(
            OP,
            format!(
                "indices of rows of {} do not fit {out_dtype:?}",
                xd.last_dim()
            ),
        ));
    }
    check_int_supported(OP, &x.client, target)?;
    let out: DeviceTensor<R> = crate::argmax::argmax(&x.client, &xd)?;
    let mut shape = xd.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = 1;
    }
    Ok(match target {
        BurnDType::U32 | BurnDType::I32 => wrap(out, &shape, target, &x),
        _ => burn_cubecl::kernel::cast(wrap(out, &shape, BurnDType::U32, &x), target),
    })
}
