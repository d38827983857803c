//! The decode step's attention block for one token of one sequence, from the QKV projection's
//! output: RoPE on q and k, the cache append, then attention over the cache.
//!
//! Separately that is two launches ([`crate::qkv::qkv_rope_cache_into`], then
//! [`super::attention_cached_into`]), and the attention waits for the first to end before it
//! reads the newest key. Where the attention runs on the tensor-core decode kernel, that kernel
//! does the first launch's work itself: every cube rotates the query rows it reads, and the
//! cube whose key split holds the newest position rotates that key and writes it and its value
//! to the cache; where that key lies in the cube's first tile after an older one, it also puts
//! them straight into the tile's shared memory (the older rows copied before the kernel waits
//! for its predecessor), else it copies the row back after a barrier. On an H200 at the 1.5B
//! shape this measured 1.0% (bf16) and 1.4% (W4A16) more decode tokens per second than the two
//! launches (two same-call rounds each). The arithmetic is the separate kernel's, so both
//! paths write the same cache bits and produce the same output; a per-head q/k norm (Qwen3) and
//! more than one token take the two launches.

use cubecl::prelude::*;

use super::plan::{run_with_rope, Problem};
use super::split_kv_mma::RopeLaunch;
use super::{validate, AttentionWorkspace, KvLen};
use crate::qkv::{check_operands, qkv_rope_cache_into, HeadShape, QkNorm};
use crate::{DeviceTensor, Result};

/// `qkv[T, (Hq + 2 Hkv) · D]` (biases added) split, rotated at positions `start[0] + t` (and
/// normalised per head with `norm`), k and v appended to rows `start[0] + t` of `k_cache` /
/// `v_cache` (`[max_len, Hkv, D]`), then causal attention of the `T` queries over the first
/// `kv_len` rows into `out[T, Hq, D]`: [`qkv_rope_cache_into`] followed by
/// [`super::attention_cached_into`], with the same operands and checks.
///
/// `kv_len` must be the length after the append (`start[0] + T`): with one token, no norm and
/// the tensor-core decode kernel (CUDA), one launch does both, and it takes the newest position
/// from `kv_len` (`kv_len - 1`) where the separate kernel takes it from `start`; with
/// [`KvLen::Appended`] the caller guarantees that the rows before the newest were written before
/// the kernel launched just before this call started (the newest is this call's). `q_out`
/// (`[T, Hq, D]`) holds the rotated queries where the two launches run; the single launch does
/// not write it.
#[allow(clippy::too_many_arguments)]
pub fn rope_attention_decode_into<R: Runtime>(
    client: &ComputeClient<R>,
    qkv: &DeviceTensor<R>,
    heads: HeadShape,
    cos: &DeviceTensor<R>,
    sin: &DeviceTensor<R>,
    start: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    norm: Option<QkNorm<'_, R>>,
    kv_len: KvLen<'_, R>,
    scale: f32,
    q_out: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    workspace: Option<&AttentionWorkspace<R>>,
) -> Result<()> {
    const OP: &str = "rope_attention_decode";
    validate::check_len_tensor(OP, start)?;
    let one_token = qkv.rank() == 2 && qkv.shape()[0] == 1;
    if norm.is_none() && one_token {
        check_operands(
            client, OP, qkv, heads, cos, sin, q_out, k_cache, v_cache, None,
        )?;
        let (hq, d) = (heads.q_heads, heads.head_dim);
        // The queries are the first Hq · D elements of the row.
        let q = DeviceTensor::from_parts(
            qkv.handle().clone(),
            &[1, hq, d],
            &[hq * d, d, 1],
            qkv.dtype(),
        );
        validate::operands(client, OP, &q, k_cache, v_cache, out, scale)?;
        let max_len = k_cache.shape()[0];
        validate::cache_len(OP, kv_len, 1, max_len)?;
        let problem = Problem {
            q: &q,
            k: k_cache,
            v: v_cache,
            out,
            batch: 1,
            lq: 1,
            hq,
            hkv: heads.kv_heads,
            d,
            kv_rows: max_len,
            len: kv_len,
            causal: true,
            scale,
            workspace,
            slots: None,
        };
        let rope = RopeLaunch { qkv, cos, sin };
        if run_with_rope(client, OP, &problem, &rope)? {
            return Ok(());
        }
    }
    qkv_rope_cache_into(
        client, qkv, heads, cos, sin, start, q_out, k_cache, v_cache, norm,
    )?;
    super::attention_cached_into(
        client, q_out, k_cache, v_cache, kv_len, scale, out, workspace,
    )
}
