//! The attention block's entry, fused: split the QKV projection, rotate q and k (RoPE, Qwen2's
//! rotate-half layout), write q out and append k and v to the KV cache — one launch per layer
//! instead of four (split, two ropes, cache write).
//!
//! The position of the first token comes from a device buffer (`start`, u32 `[1]`) so that a
//! decode step can be captured once as a CUDA graph and replayed with the position advancing.

use cubecl::prelude::*;

use crate::launch::{check_same_dtype, cube_count_1d};
use crate::{caps, DType, DeviceTensor, OpsError, Result};

#[cube(launch_unchecked)]
fn qkv_rope_cache_kernel<F: Float>(
    qkv: &[F],
    cos: &[f32],
    sin: &[f32],
    start: &[u32],
    q_out: &mut [F],
    k_cache: &mut [F],
    v_cache: &mut [F],
    tokens: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    max_len: usize,
    table_rows: usize,
    #[define(F)] _dtype: ElemType,
) {
    let heads = q_heads + 2 * kv_heads;
    let t = CUBE_POS / heads;
    let h = CUBE_POS % heads;
    let half = head_dim / 2;
    let i = UNIT_POS as usize;
    if t >= tokens || i >= half {
        terminate!();
    }
    let pos = start[0] as usize + t;
    let src = (t * heads + h) * head_dim;
    let a = qkv[src + i];
    let b = qkv[src + i + half];
    if h < q_heads + kv_heads {
        // Positions past the table reuse its last row; the host checks what it can know.
        let p = min(pos, table_rows - 1);
        let c = cos[p * half + i];
        let s = sin[p * half + i];
        let af = f32::cast_from(a);
        let bf = f32::cast_from(b);
        let ra = F::cast_from(af * c - bf * s);
        let rb = F::cast_from(bf * c + af * s);
        if h < q_heads {
            let dst = (t * q_heads + h) * head_dim;
            q_out[dst + i] = ra;
            q_out[dst + i + half] = rb;
        } else if pos < max_len {
            let dst = (pos * kv_heads + (h - q_heads)) * head_dim;
            k_cache[dst + i] = ra;
            k_cache[dst + i + half] = rb;
        }
    } else if pos < max_len {
        let dst = (pos * kv_heads + (h - q_heads - kv_heads)) * head_dim;
        v_cache[dst + i] = a;
        v_cache[dst + i + half] = b;
    }
}

/// Shapes of the attention heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Splits `qkv[T, (Hq + 2 Hkv) * D]` (the concatenated q/k/v projections, biases added), applies
/// RoPE to q and k at positions `start[0] + t`, writes `q_out[T, Hq, D]`, and stores k and v in
/// rows `start[0] + t` of `k_cache`/`v_cache` (`[max_len, Hkv, D]`).
///
/// `cos`/`sin` are f32 tables `[table_rows, D / 2]` (`ops::rope::RopeCache` builds them): entry
/// `[p, i] = cos(p * theta^(-2i / D))`. Positions live on the device, so the kernel cannot
/// report an overflow: rows past `max_len` are not written and positions past the table use its
/// last row. Callers that know the position on the host (the model does) check it first.
#[allow(clippy::too_many_arguments)]
pub fn qkv_rope_cache_into<R: Runtime>(
    client: &ComputeClient<R>,
    qkv: &DeviceTensor<R>,
    heads: HeadShape,
    cos: &DeviceTensor<R>,
    sin: &DeviceTensor<R>,
    start: &DeviceTensor<R>,
    q_out: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "qkv_rope_cache";
    caps::check_float_dtype(client, OP, qkv.dtype())?;
    let HeadShape {
        q_heads,
        kv_heads,
        head_dim,
    } = heads;
    if head_dim == 0 || !head_dim.is_multiple_of(2) || q_heads == 0 || kv_heads == 0 {
        return Err(OpsError::invalid(
            OP,
            format!("heads {q_heads}/{kv_heads} of dim {head_dim}: need non-zero heads and an even head_dim"),
        ));
    }
    let width = (q_heads + 2 * kv_heads) * head_dim;
    if qkv.rank() != 2 || qkv.shape()[1] != width || qkv.shape()[0] == 0 {
        return Err(OpsError::shape(
            OP,
            format!("qkv {:?}, expected [T, {width}]", qkv.shape()),
        ));
    }
    let tokens = qkv.shape()[0];
    if q_out.shape() != [tokens, q_heads, head_dim] {
        return Err(OpsError::shape(
            OP,
            format!(
                "q_out {:?}, expected [{tokens}, {q_heads}, {head_dim}]",
                q_out.shape()
            ),
        ));
    }
    let max_len = k_cache.shape().first().copied().unwrap_or(0);
    for cache in [k_cache, v_cache] {
        if cache.shape() != [max_len, kv_heads, head_dim] {
            return Err(OpsError::shape(
                OP,
                format!(
                    "cache {:?}, expected [max_len, {kv_heads}, {head_dim}]",
                    cache.shape()
                ),
            ));
        }
    }
    for t in [q_out, k_cache, v_cache] {
        check_same_dtype(OP, qkv, t)?;
    }
    let half = head_dim / 2;
    for table in [cos, sin] {
        if table.dtype() != DType::F32
            || table.rank() != 2
            || table.shape()[1] != half
            || table.shape()[0] == 0
        {
            return Err(OpsError::shape(
                OP,
                format!(
                    "cos/sin tables must be f32 [rows, {half}], got {:?} {}",
                    table.shape(),
                    table.dtype()
                ),
            ));
        }
    }
    if cos.shape() != sin.shape() {
        return Err(OpsError::shape(OP, "cos and sin tables differ in shape"));
    }
    if start.dtype() != DType::U32 || start.numel() != 1 {
        return Err(OpsError::invalid(
            OP,
            "start must be a u32 tensor of one element",
        ));
    }
    if [qkv, q_out, k_cache, v_cache, cos, sin]
        .iter()
        .any(|t| !t.is_contiguous())
    {
        return Err(OpsError::shape(OP, "every operand must be contiguous"));
    }
    let cubes = tokens * (q_heads + 2 * kv_heads);
    unsafe {
        qkv_rope_cache_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, cubes as u32),
            CubeDim::new_1d((half as u32).next_power_of_two().max(1)),
            qkv.as_buffer_arg(),
            cos.as_buffer_arg(),
            sin.as_buffer_arg(),
            start.as_buffer_arg(),
            q_out.as_buffer_arg(),
            k_cache.as_buffer_arg(),
            v_cache.as_buffer_arg(),
            tokens,
            q_heads,
            kv_heads,
            head_dim,
            max_len,
            cos.shape()[0],
            qkv.dtype().elem_type(),
        );
    }
    Ok(())
}
