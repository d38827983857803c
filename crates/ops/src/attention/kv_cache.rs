//! Appending new keys and values to a preallocated `[max_len, Hkv, D]` cache.

use cubecl::prelude::*;

use super::{KvLen, OP_CACHE_WRITE};
use crate::launch::{check_same_dtype, cube_count_1d};
use crate::{caps, DeviceTensor, OpsError, Result};

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn kv_cache_write_kernel<F: Float, N: Size>(
    k: &[Vector<F, N>],
    v: &[Vector<F, N>],
    k_cache: &mut [Vector<F, N>],
    v_cache: &mut [Vector<F, N>],
    start_buf: &[u32],
    start_host: usize,
    row_vectors: usize,
    len: usize,
    max_len: usize,
    #[comptime] from_device: bool,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS;
    if i >= len {
        terminate!();
    }
    let mut start = start_host;
    if comptime![from_device] {
        start = start_buf[0] as usize;
    }
    let t = i / row_vectors;
    // Rows past the cache are dropped: a device-held start cannot be checked on the host.
    if start + t < max_len {
        let dst = start * row_vectors + i;
        k_cache[dst] = k[i];
        v_cache[dst] = v[i];
    }
}

/// Copies `k[T, Hkv, D]` and `v` into rows `start..start + T` of `k_cache`/`v_cache`
/// (`[max_len, Hkv, D]`). With [`KvLen::Host`] an overflow is an error; with
/// [`KvLen::Device`] (a u32 `[1]` buffer, for graph capture) rows past `max_len` are skipped.
pub fn kv_cache_write_into<R: Runtime>(
    client: &ComputeClient<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    start: KvLen<'_, R>,
) -> Result<()> {
    const OP: &str = OP_CACHE_WRITE;
    caps::check_float_dtype(client, OP, k.dtype())?;
    if k.rank() != 3 || k.numel() == 0 {
        return Err(OpsError::shape(
            OP,
            format!("k {:?} must be [T, Hkv, D]", k.shape()),
        ));
    }
    let (t, hkv, d) = (k.shape()[0], k.shape()[1], k.shape()[2]);
    if v.shape() != k.shape() {
        return Err(OpsError::shape(
            OP,
            format!("v {:?} differs from k {:?}", v.shape(), k.shape()),
        ));
    }
    let max_len = k_cache.shape().first().copied().unwrap_or(0);
    for c in [k_cache, v_cache] {
        if c.shape() != [max_len, hkv, d] {
            return Err(OpsError::shape(
                OP,
                format!("cache {:?}, expected [max_len, {hkv}, {d}]", c.shape()),
            ));
        }
    }
    for x in [v, k_cache, v_cache] {
        check_same_dtype(OP, k, x)?;
    }
    if [k, v, k_cache, v_cache].iter().any(|x| !x.is_contiguous()) {
        return Err(OpsError::shape(OP, "every operand must be contiguous"));
    }
    let (start_host, start_buf) = super::resolve_len(OP, &start, k)?;
    if let KvLen::Host(s) = start {
        if s + t > max_len {
            return Err(OpsError::invalid(
                OP,
                format!("rows {s}..{} do not fit a cache of {max_len}", s + t),
            ));
        }
    }
    let vector = caps::vector_size_for(client, k.dtype(), hkv * d);
    let row_vectors = hkv * d / vector;
    let len = t * row_vectors;
    unsafe {
        kv_cache_write_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, len.div_ceil(256) as u32),
            CubeDim::new_1d(256),
            vector,
            k.as_buffer_arg(),
            v.as_buffer_arg(),
            k_cache.as_buffer_arg(),
            v_cache.as_buffer_arg(),
            start_buf.as_buffer_arg(),
            start_host,
            row_vectors,
            len,
            max_len,
            matches!(start, KvLen::Device(_)),
            k.dtype().elem_type(),
        );
    }
    Ok(())
}
