//! Appending new K/V rows to a preallocated `[max_len, Hkv, D]` cache.
//!
//! The cache is written in place (no per-step concatenation): rows `start..start + T` receive the
//! `T` new rows. With the start position in a device buffer the same launch can be replayed from a
//! CUDA graph while the position advances; rows that would land past `max_len` are skipped, so a
//! runaway position can never write outside the cache.

use cubecl::prelude::*;

use super::geometry::len_buffer;
use super::validate::check_len_tensor;
use super::KvLen;
use crate::launch::{check_same_dtype, cube_count_1d};
use crate::{caps, DeviceTensor, OpsError, Result};

#[cube(launch_unchecked)]
fn kv_cache_write_kernel<F: Float, N: Size>(
    k: &[Vector<F, N>],
    v: &[Vector<F, N>],
    start_buf: &[u32],
    k_cache: &mut [Vector<F, N>],
    v_cache: &mut [Vector<F, N>],
    start_host: u32,
    row_vectors: usize,
    total: usize,
    max_len: u32,
    #[comptime] device_start: bool,
    #[define(F)] _dtype: ElemType,
) {
    let idx = CUBE_POS * CUBE_DIM as usize + UNIT_POS as usize;
    let mut start = start_host;
    if comptime![device_start] {
        start = start_buf[0];
    }
    // Rows left in the cache, computed without overflow for any start.
    let room = (max_len - min(start, max_len)) as usize;
    if idx < total {
        let t = idx / row_vectors;
        if t < room {
            let dst = (start as usize + t) * row_vectors + idx % row_vectors;
            k_cache[dst] = k[idx];
            v_cache[dst] = v[idx];
        }
    }
}

/// Writes `k[T, Hkv, D]` and `v[T, Hkv, D]` into rows `start..start + T` of `k_cache` and
/// `v_cache` (`[max_len, Hkv, D]`, same dtype, contiguous).
///
/// With [`KvLen::Host`] a write past `max_len` is an [`OpsError::InvalidArgument`]. With
/// [`KvLen::Device`] (a `u32[1]` holding the start row) the host cannot check it: rows that would
/// land at or past `max_len` are skipped and the cache is left as it was there.
pub fn kv_cache_write_into<R: Runtime>(
    client: &ComputeClient<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    start: KvLen<'_, R>,
) -> Result<()> {
    const OP: &str = "kv_cache_write";
    caps::check_float_dtype(client, OP, k.dtype())?;
    for t in [v, k_cache, v_cache] {
        check_same_dtype(OP, k, t)?;
    }
    for t in [k, v, k_cache, v_cache] {
        if t.rank() != 3 {
            return Err(OpsError::shape(
                OP,
                format!("expected [rows, Hkv, D] tensors, got {:?}", t.shape()),
            ));
        }
        if !t.is_contiguous() {
            return Err(OpsError::shape(OP, "every operand must be contiguous"));
        }
    }
    if v.shape() != k.shape() {
        return Err(OpsError::shape(
            OP,
            format!("v {:?} does not match k {:?}", v.shape(), k.shape()),
        ));
    }
    if v_cache.shape() != k_cache.shape() {
        return Err(OpsError::shape(
            OP,
            format!(
                "v_cache {:?} does not match k_cache {:?}",
                v_cache.shape(),
                k_cache.shape()
            ),
        ));
    }
    let (t_rows, hkv, d) = (k.shape()[0], k.shape()[1], k.shape()[2]);
    let max_len = k_cache.shape()[0];
    if k_cache.shape()[1..] != [hkv, d] {
        return Err(OpsError::shape(
            OP,
            format!(
                "cache rows {:?} do not match the new rows {:?}",
                &k_cache.shape()[1..],
                &k.shape()[1..]
            ),
        ));
    }
    if t_rows == 0 || hkv == 0 || d == 0 || max_len == 0 {
        return Err(OpsError::shape(OP, "empty k/v or cache"));
    }
    if max_len > u32::MAX as usize {
        return Err(OpsError::shape(OP, "the cache has more than u32::MAX rows"));
    }
    let start_host = match start {
        KvLen::Host(s) => {
            if s.checked_add(t_rows).is_none_or(|end| end > max_len) {
                return Err(OpsError::invalid(
                    OP,
                    format!(
                        "rows {s}..{} do not fit a cache of {max_len} rows",
                        s.saturating_add(t_rows)
                    ),
                ));
            }
            s as u32
        }
        KvLen::Device(t) | KvLen::Appended(t) => {
            check_len_tensor(OP, t)?;
            0
        }
    };
    let row = hkv * d;
    let vector = caps::vector_size_for(client, k.dtype(), row);
    let row_vectors = row / vector;
    let total = t_rows * row_vectors;
    let cube_dim = 256u32;
    let cubes = total.div_ceil(cube_dim as usize) as u32;
    let start_tensor = len_buffer(client, start);
    unsafe {
        kv_cache_write_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, cubes),
            CubeDim::new_1d(cube_dim),
            vector,
            k.as_buffer_arg(),
            v.as_buffer_arg(),
            start_tensor.as_buffer_arg(),
            k_cache.as_buffer_arg(),
            v_cache.as_buffer_arg(),
            start_host,
            row_vectors,
            total,
            max_len as u32,
            start.device().is_some(),
            k.dtype().elem_type(),
        );
    }
    Ok(())
}
