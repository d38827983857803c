//! Scaled dot-product attention with grouped-query heads: prefill and decode, over plain K/V
//! tensors or a preallocated KV cache (no copy of the cache per step).
//!
//! `q[Lq, Hq, D]`, `k`/`v` `[Lk, Hkv, D]` (or the first `kv_len` rows of a `[max_len, Hkv, D]`
//! cache); query head `h` reads KV head `h / (Hq / Hkv)`. Causal masking with `Lq <= Lk` (a
//! prefill appended to a cache): query `i` sees key `j` iff `j <= i + Lk - Lq`. Statistics and
//! accumulation in f32. Batching is left to the caller (one call per sequence): the model runs
//! one sequence, and a batch of different lengths wants one cache per sequence anyway.
//!
//! All paths run the split-KV flash kernel of [`flash`]: decode splits the keys over many cubes
//! (flash-decoding) and merges; prefill tiles the queries. The merge needs a workspace: the
//! `_into` functions allocate one per call unless given an [`AttentionWorkspace`] (the decode
//! step passes one so that it allocates nothing and can be captured as a CUDA graph).

mod flash;
mod kv_cache;

use cubecl::prelude::*;

use crate::launch::check_same_dtype;
use crate::{caps, DType, DeviceTensor, OpsError, Result};

pub use flash::FlashPlan;
pub use kv_cache::kv_cache_write_into;

const OP: &str = "attention";
const OP_CACHE_WRITE: &str = "kv_cache_write";

/// A sequence length (or start row) known on the host, or held on the device (a u32 `[1]`
/// tensor) so that a captured decode step can replay with it changing.
pub enum KvLen<'a, R: Runtime> {
    Host(usize),
    Device(&'a DeviceTensor<R>),
}

impl<R: Runtime> Clone for KvLen<'_, R> {
    fn clone(&self) -> Self {
        match self {
            KvLen::Host(n) => KvLen::Host(*n),
            KvLen::Device(t) => KvLen::Device(t),
        }
    }
}

/// `(host value, buffer to bind)`: a device length binds its buffer, a host one binds any
/// buffer (never read).
fn resolve_len<'a, R: Runtime>(
    op: &'static str,
    len: &KvLen<'a, R>,
    fallback: &'a DeviceTensor<R>,
) -> Result<(usize, &'a DeviceTensor<R>)> {
    match len {
        KvLen::Host(n) => Ok((*n, fallback)),
        KvLen::Device(t) => {
            if t.dtype() != DType::U32 || t.numel() != 1 {
                return Err(OpsError::invalid(
                    op,
                    "a device length must be a u32 tensor of one element",
                ));
            }
            Ok((0, t))
        }
    }
}

/// Scratch for the split partials: `(acc, max, sum)` per split, KV head, query block and row.
pub struct AttentionWorkspace<R: Runtime> {
    acc: DeviceTensor<R>,
    m: DeviceTensor<R>,
    l: DeviceTensor<R>,
    parts: usize,
    d: usize,
}

impl<R: Runtime> AttentionWorkspace<R> {
    /// Room for `parts` partial tiles of head dim `d`.
    pub fn new(client: &ComputeClient<R>, parts: usize, d: usize) -> Self {
        let rows = flash::MAX_ROWS as usize;
        Self {
            acc: DeviceTensor::empty(client, &[parts * rows * d], DType::F32),
            m: DeviceTensor::empty(client, &[parts * rows], DType::F32),
            l: DeviceTensor::empty(client, &[parts * rows], DType::F32),
            parts,
            d,
        }
    }

    /// A workspace large enough for every call with up to `q_len` query tokens over at most
    /// `max_len` keys (with a device length, the grid is sized for the cache's capacity).
    pub fn for_shapes(
        client: &ComputeClient<R>,
        q_len: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        max_len: usize,
    ) -> Self {
        // The schedule trades query blocks for splits, so take the largest over 1..=q_len.
        let parts = (1..=q_len.max(1))
            .map(|l| Schedule::new(client, l, q_heads, kv_heads, head_dim, max_len).parts(kv_heads))
            .max()
            .unwrap_or(1);
        Self::new(client, parts, head_dim)
    }
}

/// How the work is cut: query blocks of `bq` tokens, `splits` key ranges of `keys_per_split`.
struct Schedule {
    bq: usize,
    q_blocks: usize,
    splits: usize,
    keys_per_split: usize,
}

impl Schedule {
    fn new<R: Runtime>(
        client: &ComputeClient<R>,
        q_len: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        keys: usize,
    ) -> Self {
        let group = q_heads / kv_heads;
        let bq = (flash::MAX_ROWS as usize / group).max(1);
        let q_blocks = q_len.div_ceil(bq);
        // Enough cubes for two waves over the SMs; each split keeps at least a few key blocks.
        let cubes_wanted = 2 * caps::num_sms(client) as usize;
        let base = q_blocks * kv_heads;
        let bk = flash::block_keys(head_dim);
        let max_splits = keys.div_ceil(4 * bk).max(1);
        let splits = cubes_wanted.div_ceil(base).clamp(1, max_splits);
        let keys_per_split = keys.div_ceil(splits).div_ceil(bk) * bk;
        let splits = keys.div_ceil(keys_per_split.max(1)).max(1);
        Self {
            bq,
            q_blocks,
            splits,
            keys_per_split: keys_per_split.max(bk),
        }
    }

    fn parts(&self, kv_heads: usize) -> usize {
        self.q_blocks * kv_heads * self.splits
    }
}

struct Shapes {
    q_len: usize,
    hq: usize,
    hkv: usize,
    d: usize,
}

fn check_qkv<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<Shapes> {
    caps::check_float_dtype(client, OP, q.dtype())?;
    for t in [k, v, out] {
        check_same_dtype(OP, q, t)?;
    }
    if [q, k, v, out].iter().any(|t| !t.is_contiguous()) {
        return Err(OpsError::shape(OP, "q, k, v and out must be contiguous"));
    }
    let (q_len, hq, d) = match q.shape() {
        [l, h, d] if *l > 0 && *h > 0 && *d > 0 => (*l, *h, *d),
        other => {
            return Err(OpsError::shape(
                OP,
                format!("q {other:?} must be [Lq, Hq, D]"),
            ))
        }
    };
    let hkv = match k.shape() {
        [_, h, kd] if *kd == d && *h > 0 => *h,
        other => {
            return Err(OpsError::shape(
                OP,
                format!("k {other:?} must be [Lk, Hkv, {d}]"),
            ))
        }
    };
    if v.shape() != k.shape() {
        return Err(OpsError::shape(
            OP,
            format!("v {:?} differs from k {:?}", v.shape(), k.shape()),
        ));
    }
    if hq % hkv != 0 {
        return Err(OpsError::shape(
            OP,
            format!("{hq} query heads are not a multiple of {hkv} KV heads"),
        ));
    }
    if hq / hkv > flash::MAX_ROWS as usize {
        return Err(OpsError::invalid(
            OP,
            format!("at most {} query heads per KV head", flash::MAX_ROWS),
        ));
    }
    if d > 256 {
        return Err(OpsError::invalid(
            OP,
            format!("head_dim {d} is above the supported 256"),
        ));
    }
    if out.shape() != q.shape() {
        return Err(OpsError::shape(
            OP,
            format!("out {:?} must match q {:?}", out.shape(), q.shape()),
        ));
    }
    Ok(Shapes { q_len, hq, hkv, d })
}

/// `softmax(q·kᵀ · scale [+ causal mask]) · v` over all of `k`/`v` (`[Lk, Hkv, D]`).
pub fn attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    scale: f32,
    causal: bool,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, q.shape(), q.dtype());
    attention_into(client, q, k, v, scale, causal, &out)?;
    Ok(out)
}

/// [`attention`] into a preallocated `out[Lq, Hq, D]`.
pub fn attention_into<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    scale: f32,
    causal: bool,
    out: &DeviceTensor<R>,
) -> Result<()> {
    let lk = k.shape().first().copied().unwrap_or(0);
    run(client, q, k, v, KvLen::Host(lk), scale, causal, out, None)
}

/// Causal attention over the first `kv_len` rows of a `[max_len, Hkv, D]` cache: the layout of
/// a decode step (`Lq` new tokens already appended, so `Lq <= kv_len`).
#[allow(clippy::too_many_arguments)]
pub fn attention_cached_into<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    kv_len: KvLen<'_, R>,
    scale: f32,
    out: &DeviceTensor<R>,
    workspace: Option<&AttentionWorkspace<R>>,
) -> Result<()> {
    run(
        client, q, k_cache, v_cache, kv_len, scale, true, out, workspace,
    )
}

#[allow(clippy::too_many_arguments)]
fn run<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    kv_len: KvLen<'_, R>,
    scale: f32,
    causal: bool,
    out: &DeviceTensor<R>,
    workspace: Option<&AttentionWorkspace<R>>,
) -> Result<()> {
    let sh = check_qkv(client, q, k, v, out)?;
    if !scale.is_finite() {
        return Err(OpsError::invalid(
            OP,
            format!("scale must be finite, got {scale}"),
        ));
    }
    let max_len = k.shape()[0];
    let (len_host, len_buf) = resolve_len(OP, &kv_len, q)?;
    // The grid is sized for the largest length the keys can have: the host length, or the
    // cache's capacity when the length lives on the device.
    let keys = match kv_len {
        KvLen::Host(n) => {
            if n == 0 || n > max_len {
                return Err(OpsError::invalid(
                    OP,
                    format!("kv_len {n} must be in 1..={max_len}"),
                ));
            }
            if causal && sh.q_len > n {
                return Err(OpsError::invalid(
                    OP,
                    format!("causal attention needs Lq {} <= kv_len {n}", sh.q_len),
                ));
            }
            n
        }
        KvLen::Device(_) => max_len,
    };
    let sched = Schedule::new(client, sh.q_len, sh.hq, sh.hkv, sh.d, keys);
    let parts = sched.parts(sh.hkv);
    let owned;
    let ws = match workspace {
        Some(ws) => {
            if ws.parts < parts || ws.d != sh.d {
                return Err(OpsError::invalid(
                    OP,
                    format!(
                        "workspace for {} parts of dim {} is too small ({parts} of dim {} needed)",
                        ws.parts, ws.d, sh.d
                    ),
                ));
            }
            ws
        }
        None => {
            owned = AttentionWorkspace::new(client, parts, sh.d);
            &owned
        }
    };
    let vector = caps::vector_size_for(client, q.dtype(), sh.d);
    let plan = FlashPlan {
        d: sh.d as u32,
        bk: flash::block_keys(sh.d) as u32,
        causal,
        len_from_device: matches!(kv_len, KvLen::Device(_)),
    };
    let group = sh.hq / sh.hkv;
    unsafe {
        flash::flash_split_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(sched.splits as u32, (sched.q_blocks * sh.hkv) as u32, 1),
            CubeDim::new_1d(flash::UNITS),
            vector,
            q.as_buffer_arg(),
            k.as_buffer_arg(),
            v.as_buffer_arg(),
            len_buf.as_buffer_arg(),
            ws.acc.as_buffer_arg(),
            ws.m.as_buffer_arg(),
            ws.l.as_buffer_arg(),
            len_host,
            sh.q_len,
            sh.hq,
            sh.hkv,
            group,
            sched.bq,
            sched.keys_per_split,
            sched.splits,
            scale,
            plan,
            q.dtype().elem_type(),
        );
        flash::flash_merge_kernel::launch_unchecked::<R>(
            client,
            crate::launch::cube_count_1d(client, (sh.q_len * sh.hq) as u32),
            CubeDim::new_1d((sh.d as u32).next_power_of_two()),
            ws.acc.as_buffer_arg(),
            ws.m.as_buffer_arg(),
            ws.l.as_buffer_arg(),
            out.as_buffer_arg(),
            sh.q_len,
            sh.hq,
            sh.hkv,
            group,
            sched.bq,
            sched.splits,
            sh.d as u32,
            q.dtype().elem_type(),
        );
    }
    Ok(())
}
