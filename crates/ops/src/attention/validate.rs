//! The checks every attention entry point makes before it plans a launch.

use cubecl::prelude::*;

use super::{KvLen, MAX_HEAD_DIM};
use crate::launch::check_same_dtype;
use crate::{caps, DType, DeviceTensor, OpsError, Result};

/// Validates dtypes, ranks and shapes shared by the attention entry points; returns
/// `(batch, Lq, Hq, D)`.
pub(crate) fn operands<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    scale: f32,
) -> Result<(usize, usize, usize, usize)> {
    caps::check_float_dtype(client, op, q.dtype())?;
    for t in [k, v, out] {
        check_same_dtype(op, q, t)?;
    }
    let rank = q.rank();
    if rank != 3 && rank != 4 {
        return Err(OpsError::shape(
            op,
            format!(
                "q must be [Lq, Hq, D] or [B, Lq, Hq, D], got {:?}",
                q.shape()
            ),
        ));
    }
    for (name, t) in [("k", k), ("v", v), ("out", out)] {
        if t.rank() != rank {
            return Err(OpsError::shape(
                op,
                format!(
                    "{name} {:?} has another rank than q {:?}",
                    t.shape(),
                    q.shape()
                ),
            ));
        }
    }
    for t in [q, k, v, out] {
        if !t.is_contiguous() {
            return Err(OpsError::shape(op, "every operand must be contiguous"));
        }
    }
    if out.shape() != q.shape() {
        return Err(OpsError::shape(
            op,
            format!("out {:?} does not match q {:?}", out.shape(), q.shape()),
        ));
    }
    if v.shape() != k.shape() {
        return Err(OpsError::shape(
            op,
            format!("v {:?} does not match k {:?}", v.shape(), k.shape()),
        ));
    }
    let qs = &q.shape()[rank - 3..];
    let ks = &k.shape()[rank - 3..];
    let batch = if rank == 4 { q.shape()[0] } else { 1 };
    if rank == 4 && k.shape()[0] != batch {
        return Err(OpsError::shape(
            op,
            format!(
                "batch of k {:?} does not match q {:?}",
                k.shape(),
                q.shape()
            ),
        ));
    }
    let (lq, hq, d) = (qs[0], qs[1], qs[2]);
    let hkv = ks[1];
    if batch == 0 || lq == 0 || hq == 0 || d == 0 || hkv == 0 {
        return Err(OpsError::shape(
            op,
            format!("empty attention: q {:?}, k {:?}", q.shape(), k.shape()),
        ));
    }
    if ks[2] != d {
        return Err(OpsError::shape(
            op,
            format!("head dim of k ({}) differs from q ({d})", ks[2]),
        ));
    }
    if hq % hkv != 0 {
        return Err(OpsError::shape(
            op,
            format!("{hq} query heads are not a multiple of {hkv} KV heads"),
        ));
    }
    if d > MAX_HEAD_DIM {
        return Err(OpsError::shape(
            op,
            format!("head dim {d} exceeds the supported {MAX_HEAD_DIM}"),
        ));
    }
    // The kernels index rows with u32 (elements with usize).
    let rows = (batch * lq * hq).max(batch * ks[0] * hkv);
    if rows > u32::MAX as usize / 2 || batch * ks[0] > u32::MAX as usize / 2 {
        return Err(OpsError::shape(op, "too many rows for 32-bit row indices"));
    }
    if !scale.is_finite() {
        return Err(OpsError::invalid(
            op,
            format!("scale must be finite, got {scale}"),
        ));
    }
    Ok((batch, lq, hq, d))
}

/// Checks the length of a cache of `max_len` rows read by `lq` queries: a host length must satisfy
/// `Lq <= kv_len <= max_len`, a device one must be a `u32[1]`.
pub(crate) fn cache_len<R: Runtime>(
    op: &'static str,
    kv_len: KvLen<'_, R>,
    lq: usize,
    max_len: usize,
) -> Result<()> {
    if max_len == 0 {
        return Err(OpsError::shape(op, "the cache has no rows"));
    }
    match kv_len {
        KvLen::Host(len) => {
            if len > max_len || len < lq || len == 0 {
                return Err(OpsError::invalid(
                    op,
                    format!("kv_len {len} must satisfy Lq ({lq}) <= kv_len <= max_len ({max_len}) and be > 0"),
                ));
            }
            Ok(())
        }
        KvLen::Device(t) | KvLen::Appended(t) => check_len_tensor(op, t),
    }
}

/// Checks a device length/start tensor: `u32` of shape `[1]`.
pub(crate) fn check_len_tensor<R: Runtime>(op: &'static str, t: &DeviceTensor<R>) -> Result<()> {
    if t.dtype() != DType::U32 {
        return Err(OpsError::UnsupportedDType {
            op,
            dtype: t.dtype(),
            runtime: "any",
            detail: "the device length must be a u32 tensor".into(),
        });
    }
    if t.shape() != [1] {
        return Err(OpsError::shape(
            op,
            format!("the device length must have shape [1], got {:?}", t.shape()),
        ));
    }
    Ok(())
}
