//! Attention on Burn primitives: prefill, decode over a KV cache, and the cache write.

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

use super::{check_same_device, dtype_of, from_device_tensor, operand, to_device_tensor};
use crate::attention::KvLen;
use crate::{DeviceTensor, Result};

/// [`crate::attention::attention`] on Burn primitives: `softmax(q·kᵀ·scale [+ causal mask])·v`
/// with grouped-query heads, scores and statistics in f32.
///
/// Layouts are the model's, not Burn's `[B, H, L, D]`: `q[Lq, Hq, D]` with `k`, `v` `[Lk, Hkv, D]`,
/// or all with a leading batch (`[B, Lq, Hq, D]`, `[B, Lk, Hkv, D]`, independent sequences of
/// equal lengths). `Hq` is a multiple of `Hkv` (query head `h` reads KV head `h / (Hq / Hkv)`),
/// `D <= 256`, one float dtype (f32, f16 or bf16). With `causal`, query `i` sees key `j` iff
/// `j <= i + Lk - Lq` (the usual lower triangle when `Lq == Lk`; `Lq > Lk` is refused). `scale`
/// is usually `1 / sqrt(D)`. Output: q's shape and dtype.
///
/// Non-contiguous inputs are copied to contiguous first (so a tensor in Burn's layout can be
/// passed as `float_swap_dims(t, 1, 2)`, at the cost of a copy).
pub fn attention<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    scale: f32,
    causal: bool,
) -> Result<CubeTensor<R>> {
    const OP: &str = "attention";
    let (qd, q) = to_device_tensor(OP, q)?;
    let kd = operand(OP, &q, k)?;
    let vd = operand(OP, &q, v)?;
    let out = crate::attention::attention(&q.client, &qd, &kd, &vd, scale, causal)?;
    Ok(from_device_tensor(out, &q))
}

/// Decode attention over a KV cache: [`crate::attention::attention_cached_into`] with the length
/// known on the host.
///
/// `q[Lq, Hq, D]` are the last `Lq` positions of a sequence whose first `kv_len` rows are in
/// `k_cache`, `v_cache` `[max_len, Hkv, D]` (filled by [`kv_cache_write`]); query `i` sees cache
/// row `j` iff `j <= i + kv_len - Lq`. Requires `Lq <= kv_len <= max_len` (an
/// [`crate::OpsError::InvalidArgument`] otherwise); rows past `kv_len` are never read. Heads and
/// dtypes as in [`attention`]. Output: q's shape and dtype.
///
/// The caches are read from their own buffers when contiguous; non-contiguous inputs are copied
/// to contiguous first (for a cache that is a full copy per call: keep caches contiguous).
pub fn attention_cached<R: CubeRuntime>(
    q: CubeTensor<R>,
    k_cache: CubeTensor<R>,
    v_cache: CubeTensor<R>,
    kv_len: usize,
    scale: f32,
) -> Result<CubeTensor<R>> {
    const OP: &str = "attention_cached";
    let (qd, q) = to_device_tensor(OP, q)?;
    let kd = operand(OP, &q, k_cache)?;
    let vd = operand(OP, &q, v_cache)?;
    let out = DeviceTensor::empty(&q.client, qd.shape(), qd.dtype());
    crate::attention::attention_cached_into(
        &q.client,
        &qd,
        &kd,
        &vd,
        KvLen::Host(kv_len),
        scale,
        &out,
        None,
    )?;
    Ok(from_device_tensor(out, &q))
}

/// Writes `k`, `v` `[T, Hkv, D]` into rows `start..start + T` of the caches `k_cache`, `v_cache`
/// `[max_len, Hkv, D]` (one float dtype): [`crate::attention::kv_cache_write_into`]. Rows past
/// `max_len` are an [`crate::OpsError::InvalidArgument`].
///
/// The caches are updated through `&mut` so that an error leaves them as they were. A cache whose
/// buffer nothing else holds is written in place (the decode loop's
/// `kv_cache_write(&mut k_cache, &mut v_cache, k, v, len)?`); one that is shared (a clone kept
/// elsewhere, a view of a larger tensor that is still alive) or not contiguous is first replaced
/// by a contiguous copy, so that no other tensor sees the write (Burn tensors are values).
/// Non-contiguous `k`, `v` are copied to contiguous first.
pub fn kv_cache_write<R: CubeRuntime>(
    k_cache: &mut CubeTensor<R>,
    v_cache: &mut CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    start: usize,
) -> Result<()> {
    const OP: &str = "kv_cache_write";
    // The dtypes are checked before a cache is copied (Burn's copy kernel must not meet a dtype
    // the runtime lacks), and the caches are made writable while k and v still hold their
    // buffers (so a k that views a cache makes that cache shared).
    dtype_of(OP, k_cache)?;
    for t in [&*v_cache, &k, &v] {
        check_same_device(OP, k_cache, t)?;
        dtype_of(OP, t)?;
    }
    make_writable(k_cache);
    make_writable(v_cache);
    let (kcd, _) = to_device_tensor(OP, k_cache.clone())?;
    let (vcd, _) = to_device_tensor(OP, v_cache.clone())?;
    let kd = operand(OP, k_cache, k)?;
    let vd = operand(OP, k_cache, v)?;
    crate::attention::kv_cache_write_into(&k_cache.client, &kd, &vd, &kcd, &vcd, KvLen::Host(start))
}

/// Replaces `t` by a contiguous copy unless its buffer may be written: contiguous and held by
/// nobody else.
fn make_writable<R: CubeRuntime>(t: &mut CubeTensor<R>) {
    if !t.is_contiguous() {
        *t = burn_cubecl::kernel::into_contiguous(t.clone());
    } else if !t.can_mut() {
        *t = t.copy();
    }
}
