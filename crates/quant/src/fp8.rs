//! `fp8_gemm(a[M, K], b[K, N], a_scale?, b_scale?, out_dtype)`, with the operand and scale
//! contract of `torch._scaled_mm`. Float operands are quantized here to e4m3 (`a` per row, `b`
//! per column, `s = max|r| / 448`); pre-quantized e4m3 operands must come with their scales, and
//! a scale given for a float operand is an error rather than silently ignored.

use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor, OpsError, Result};

use crate::format::QuantFormat;
use crate::gemm8::KernelChoice;
use crate::layout::{check_byte_matrix, check_scales};
use crate::linear8::gemm8_into;
use crate::rowquant::quantize_per_row;
use crate::transpose::{transpose_bytes, transpose_float};

const OP: &str = "fp8_gemm";

/// `out[M, N] = a · b` in `out_dtype` with e4m3 operands and f32 accumulation.
///
/// - `a`: float `[M, K]` (quantized per row here; `a_scale` must be `None`), or an e4m3 `[M, K]`
///   padded matrix (as [`crate::quantize_per_row`] makes) with `a_scale` `[M]` or `[1]` (f32).
/// - `b`: float `[K, N]` (quantized per column here; `b_scale` must be `None`), or an e4m3
///   `[K, N]` padded matrix with `b_scale` `[N]` or `[1]`.
pub fn fp8_gemm<R: Runtime>(
    client: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    a_scale: Option<&DeviceTensor<R>>,
    b_scale: Option<&DeviceTensor<R>>,
    out_dtype: DType,
) -> Result<DeviceTensor<R>> {
    caps::check_float_dtype(client, OP, out_dtype)?;
    for (what, t) in [("a", a), ("b", b)] {
        if t.rank() != 2 || t.numel() == 0 {
            return Err(OpsError::shape(
                OP,
                format!("{what} must be a non-empty matrix, got {:?}", t.shape()),
            ));
        }
    }
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let (kb, n) = (b.shape()[0], b.shape()[1]);
    if k != kb {
        return Err(OpsError::shape(
            OP,
            format!(
                "a {:?} times b {:?}: inner dimensions differ",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let (qa, sa) = operand(client, "a", a, a_scale, m, |t| {
        quantize_per_row(client, t, QuantFormat::Fp8E4M3)
    })?;
    // b is [K, N]; the GEMM wants it K-contiguous as [N, K].
    let (qb, sb) = match b.dtype() {
        DType::F8E4M3 => {
            let pitch = check_byte_matrix(OP, "b", b, DType::F8E4M3)?;
            let scale = required_scale("b", b_scale, n)?;
            (
                transpose_bytes(client, b, pitch, DType::F8E4M3),
                scale.clone(),
            )
        }
        _ => {
            float_operand(client, "b", b, b_scale)?;
            let bt = transpose_float(client, b);
            quantize_per_row(client, &bt, QuantFormat::Fp8E4M3)?
        }
    };
    let out = DeviceTensor::empty(client, &[m, n], out_dtype);
    gemm8_into(
        client,
        &qa,
        &sa,
        &qb,
        &sb,
        None,
        &out,
        KernelChoice::default(),
    )?;
    Ok(out)
}

/// The e4m3 codes and scales of the first operand: as given (checked), or quantized by `quantize`.
fn operand<R: Runtime>(
    client: &ComputeClient<R>,
    what: &'static str,
    t: &DeviceTensor<R>,
    scale: Option<&DeviceTensor<R>>,
    len: usize,
    quantize: impl FnOnce(&DeviceTensor<R>) -> Result<(DeviceTensor<R>, DeviceTensor<R>)>,
) -> Result<(DeviceTensor<R>, DeviceTensor<R>)> {
    if t.dtype() == DType::F8E4M3 {
        check_byte_matrix(OP, what, t, DType::F8E4M3)?;
        let s = required_scale(what, scale, len)?;
        return Ok((t.clone(), s.clone()));
    }
    float_operand(client, what, t, scale)?;
    quantize(t)
}

fn required_scale<'a, R: Runtime>(
    what: &'static str,
    scale: Option<&'a DeviceTensor<R>>,
    len: usize,
) -> Result<&'a DeviceTensor<R>> {
    let s = scale.ok_or_else(|| {
        OpsError::invalid(
            OP,
            format!("{what} is pre-quantized e4m3, so {what}_scale is required"),
        )
    })?;
    check_scales(OP, &format!("{what}_scale"), s, len, true)?;
    Ok(s)
}

fn float_operand<R: Runtime>(
    client: &ComputeClient<R>,
    what: &'static str,
    t: &DeviceTensor<R>,
    scale: Option<&DeviceTensor<R>>,
) -> Result<()> {
    caps::check_float_dtype(client, OP, t.dtype())?;
    if scale.is_some() {
        return Err(OpsError::invalid(
            OP,
            format!(
                "{what} is {} and is quantized here; {what}_scale is only for pre-quantized e4m3 \
                 input",
                t.dtype()
            ),
        ));
    }
    if !t.is_contiguous() {
        return Err(OpsError::shape(OP, format!("{what} must be contiguous")));
    }
    Ok(())
}
