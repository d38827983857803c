//! The attention block's entry, fused: split the QKV projection, optionally normalise q and k per
//! head (Qwen3's `q_norm` / `k_norm`), rotate them (RoPE, the rotate-half layout of Qwen2,
//! Qwen3 and Llama), write q out and append k and v to the KV cache — one launch per layer
//! instead of four or six (split, two norms, two ropes, cache write).
//!
//! The position of the first token comes from a device buffer (`start`, u32 `[1]`) so that a
//! decode step can be captured once as a CUDA graph and replayed with the position advancing.
//! At decode sizes under programmatic dependent launch the kernel lets the next one launch as it
//! starts, so that the decode attention after it loads the older keys while it runs.
//!
//! One cube per (token, head) and one unit per rotated pair `(x[i], x[i + D/2])`. The per-head
//! norm is computed in f32 and rounded to the dtype only with the rotation; it sums the squares
//! over the cube with `ops::reduce::cube_sum` (planes where the runtime has
//! them, a shared-memory tree otherwise); without a norm the kernel compiles to the plain split +
//! rotate + append, with no extra bindings (the norm operands are comptime options).

use cubecl::prelude::*;

use crate::launch::{check_same_dtype, cube_count_1d};
use crate::reduce::{cube_sum, ReducePlan};
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
    q_norm: ComptimeOption<Box<[F]>>,
    k_norm: ComptimeOption<Box<[F]>>,
    norm_eps: ComptimeOption<f32>,
    tokens: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    max_len: usize,
    table_rows: usize,
    ragged: u32,
    slots: usize,
    #[comptime] norm: bool,
    #[comptime] plan: ReducePlan,
    #[comptime] trigger: bool,
    #[define(F)] _dtype: ElemType,
) {
    if comptime![trigger] {
        // The attention after this kernel launches now and loads the keys this one does not
        // write while it runs; it still waits for this kernel's completion before the rest.
        gpu_asm!("griddepcontrol.launch_dependents;");
        gpu_asm!("griddepcontrol.wait;");
    }
    let heads = q_heads + 2 * kv_heads;
    let t = CUBE_POS / heads;
    let h = CUBE_POS % heads;
    let half = head_dim / 2;
    let i = UNIT_POS as usize;
    let src = (t * heads + h) * head_dim;
    let mut a = F::new(0.0);
    let mut b = F::new(0.0);
    if comptime![norm] {
        // Every unit of the cube takes part in the norm's reduction (it synchronises the
        // cube): the units past the head's pairs carry zeros and leave after it.
        if t >= tokens {
            terminate!();
        }
        if i < half {
            a = qkv[src + i];
            b = qkv[src + i + half];
        }
    } else {
        if t >= tokens || i >= half {
            terminate!();
        }
        a = qkv[src + i];
        b = qkv[src + i + half];
    }
    let mut af = f32::cast_from(a);
    let mut bf = f32::cast_from(b);
    #[comptime]
    match q_norm {
        ComptimeOption::Some(q_weight) => {
            let k_weight = k_norm.unwrap();
            let eps = norm_eps.unwrap();
            let sum = cube_sum(af * af + bf * bf, plan);
            if i >= half {
                terminate!();
            }
            if h < q_heads + kv_heads {
                // Normalised, weighted and rotated in f32, rounded to the dtype once: closer to
                // an f32 reference than Hugging Face's half-precision path, which rounds after
                // the normalisation, the weight and the rotation.
                let inv = f32::inverse_sqrt(sum / f32::cast_from(head_dim) + eps);
                let mut wa = k_weight[i];
                let mut wb = k_weight[i + half];
                if h < q_heads {
                    wa = q_weight[i];
                    wb = q_weight[i + half];
                }
                af = af * inv * f32::cast_from(wa);
                bf = bf * inv * f32::cast_from(wb);
            }
        }
        ComptimeOption::None => {}
    }
    // One sequence: token t at `start[0] + t` of the cache. A ragged batch: token t is its
    // sequence's newest, at position `start[2t]` of cache slot `start[2t + 1]`.
    let mut pos = start[0] as usize + t;
    let mut first_row = 0usize;
    if ragged != 0 {
        pos = start[2 * t] as usize;
        first_row = min(start[2 * t + 1] as usize, slots - 1) * max_len;
    }
    if h < q_heads + kv_heads {
        // Positions past the table reuse its last row; the host checks what it can know.
        let p = min(pos, table_rows - 1);
        let c = cos[p * half + i];
        let s = sin[p * half + i];
        let ra = F::cast_from(af * c - bf * s);
        let rb = F::cast_from(bf * c + af * s);
        if h < q_heads {
            let dst = (t * q_heads + h) * head_dim;
            q_out[dst + i] = ra;
            q_out[dst + i + half] = rb;
        } else if pos < max_len {
            let dst = ((first_row + pos) * kv_heads + (h - q_heads)) * head_dim;
            k_cache[dst + i] = ra;
            k_cache[dst + i + half] = rb;
        }
    } else if pos < max_len {
        let dst = ((first_row + pos) * kv_heads + (h - q_heads - kv_heads)) * head_dim;
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

/// RMSNorm of each q and k head over `head_dim` (Qwen3's `q_norm` / `k_norm`), applied before
/// the rotation: `x * rsqrt(mean(x²) + eps) * weight`, in f32 like the rotation that follows.
pub struct QkNorm<'a, R: Runtime> {
    /// `[head_dim]`, the dtype of the activations: the weight of every q head.
    pub q_weight: &'a DeviceTensor<R>,
    /// `[head_dim]`: the weight of every k head.
    pub k_weight: &'a DeviceTensor<R>,
    pub eps: f32,
}

impl<R: Runtime> Clone for QkNorm<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for QkNorm<'_, R> {}

/// Splits `qkv[T, (Hq + 2 Hkv) * D]` (the concatenated q/k/v projections, biases added),
/// normalises each q and k head when `norm` is given, applies RoPE to q and k at positions
/// `start[0] + t`, writes `q_out[T, Hq, D]`, and stores k and v in rows `start[0] + t` of
/// `k_cache`/`v_cache` (`[max_len, Hkv, D]`).
///
/// `cos`/`sin` are f32 tables `[table_rows, D / 2]` (`ops::rope::RopeCache` builds them): entry
/// `[p, i] = cos(p * inv_freq[i])`. Positions live on the device, so the kernel cannot
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
    norm: Option<QkNorm<'_, R>>,
) -> Result<()> {
    const OP: &str = "qkv_rope_cache";
    if start.dtype() != DType::U32 || start.numel() != 1 {
        return Err(OpsError::invalid(
            OP,
            "start must be a u32 tensor of one element",
        ));
    }
    let caches = Caches {
        k: k_cache,
        v: v_cache,
        slots: None,
    };
    launch(client, OP, qkv, heads, cos, sin, start, q_out, caches, norm)
}

/// [`qkv_rope_cache_into`] for a ragged batch (continuous batching's decode step): row `b` of
/// `qkv[B, (Hq + 2 Hkv) * D]` is the newest token of a sequence at position `seqs[b, 0]` of
/// cache slot `seqs[b, 1]`. Its q (normalised when `norm` is given, rotated at that position)
/// goes to row `b` of `q_out[B, Hq, D]`, its k and v to that position of that slot of `k_cache`
/// / `v_cache` (`[slots, max_len, Hkv, D]`).
///
/// `seqs` is a contiguous u32 `[B, 2]` device table of `(position, slot)`, read when the kernel
/// runs; positions past `max_len` are not written and slots past the last are clamped to it.
/// Each row is computed exactly as [`qkv_rope_cache_into`] computes that token alone.
#[allow(clippy::too_many_arguments)]
pub fn qkv_rope_cache_ragged_into<R: Runtime>(
    client: &ComputeClient<R>,
    qkv: &DeviceTensor<R>,
    heads: HeadShape,
    cos: &DeviceTensor<R>,
    sin: &DeviceTensor<R>,
    seqs: &DeviceTensor<R>,
    q_out: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    norm: Option<QkNorm<'_, R>>,
) -> Result<()> {
    const OP: &str = "qkv_rope_cache_ragged";
    let rows = qkv.shape().first().copied().unwrap_or(0);
    if seqs.dtype() != DType::U32 || seqs.shape() != [rows, 2] || !seqs.is_contiguous() {
        return Err(OpsError::shape(
            OP,
            format!(
                "seqs must be a contiguous u32 [{rows}, 2] table of (position, slot), got {} {:?}",
                seqs.dtype(),
                seqs.shape()
            ),
        ));
    }
    if k_cache.rank() != 4 || k_cache.shape()[0] == 0 {
        return Err(OpsError::shape(
            OP,
            format!(
                "the cache must be [slots, max_len, Hkv, D], got {:?}",
                k_cache.shape()
            ),
        ));
    }
    let slots = k_cache.shape()[0];
    let flat = |t: &DeviceTensor<R>| -> Result<DeviceTensor<R>> {
        let s = t.shape();
        if s.len() != 4 || s[0] != slots {
            return Err(OpsError::shape(
                OP,
                format!("v cache {s:?} does not match k {:?}", k_cache.shape()),
            ));
        }
        t.reshape(&[s[0] * s[1], s[2], s[3]])
    };
    let (k, v) = (flat(k_cache)?, flat(v_cache)?);
    let caches = Caches {
        k: &k,
        v: &v,
        slots: Some(slots),
    };
    launch(client, OP, qkv, heads, cos, sin, seqs, q_out, caches, norm)
}

/// The caches a launch appends to: one sequence's `[max_len, Hkv, D]`, or `slots` sequences'
/// (`[slots * max_len, Hkv, D]` seen flat).
struct Caches<'a, R: Runtime> {
    k: &'a DeviceTensor<R>,
    v: &'a DeviceTensor<R>,
    slots: Option<usize>,
}

/// The checks of [`qkv_rope_cache_into`] (`k_cache` / `v_cache` seen as `[rows, Hkv, D]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_operands<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    qkv: &DeviceTensor<R>,
    heads: HeadShape,
    cos: &DeviceTensor<R>,
    sin: &DeviceTensor<R>,
    q_out: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    norm: Option<&QkNorm<'_, R>>,
) -> Result<()> {
    caps::check_float_dtype(client, op, qkv.dtype())?;
    let HeadShape {
        q_heads,
        kv_heads,
        head_dim,
    } = heads;
    if head_dim == 0 || !head_dim.is_multiple_of(2) || q_heads == 0 || kv_heads == 0 {
        return Err(OpsError::invalid(
            op,
            format!("heads {q_heads}/{kv_heads} of dim {head_dim}: need non-zero heads and an even head_dim"),
        ));
    }
    let width = (q_heads + 2 * kv_heads) * head_dim;
    if qkv.rank() != 2 || qkv.shape()[1] != width || qkv.shape()[0] == 0 {
        return Err(OpsError::shape(
            op,
            format!("qkv {:?}, expected [T, {width}]", qkv.shape()),
        ));
    }
    let tokens = qkv.shape()[0];
    if q_out.shape() != [tokens, q_heads, head_dim] {
        return Err(OpsError::shape(
            op,
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
                op,
                format!(
                    "cache {:?}, expected [max_len, {kv_heads}, {head_dim}]",
                    cache.shape()
                ),
            ));
        }
    }
    for t in [q_out, k_cache, v_cache] {
        check_same_dtype(op, qkv, t)?;
    }
    let half = head_dim / 2;
    for table in [cos, sin] {
        if table.dtype() != DType::F32
            || table.rank() != 2
            || table.shape()[1] != half
            || table.shape()[0] == 0
        {
            return Err(OpsError::shape(
                op,
                format!(
                    "cos/sin tables must be f32 [rows, {half}], got {:?} {}",
                    table.shape(),
                    table.dtype()
                ),
            ));
        }
    }
    if cos.shape() != sin.shape() {
        return Err(OpsError::shape(op, "cos and sin tables differ in shape"));
    }
    if [qkv, q_out, k_cache, v_cache, cos, sin]
        .iter()
        .any(|t| !t.is_contiguous())
    {
        return Err(OpsError::shape(op, "every operand must be contiguous"));
    }
    if let Some(n) = norm {
        check_norm(op, qkv, n, head_dim)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    qkv: &DeviceTensor<R>,
    heads: HeadShape,
    cos: &DeviceTensor<R>,
    sin: &DeviceTensor<R>,
    start: &DeviceTensor<R>,
    q_out: &DeviceTensor<R>,
    caches: Caches<'_, R>,
    norm: Option<QkNorm<'_, R>>,
) -> Result<()> {
    let (k_cache, v_cache) = (caches.k, caches.v);
    check_operands(
        client,
        op,
        qkv,
        heads,
        cos,
        sin,
        q_out,
        k_cache,
        v_cache,
        norm.as_ref(),
    )?;
    let HeadShape {
        q_heads,
        kv_heads,
        head_dim,
    } = heads;
    let tokens = qkv.shape()[0];
    let max_len = k_cache.shape()[0];
    let half = head_dim / 2;
    let cube_dim = (half as u32).next_power_of_two().max(1);
    let plan = ReducePlan::new(client, cube_dim);
    let cubes = tokens * (q_heads + 2 * kv_heads);
    // Decode sizes (one wave) under programmatic dependent launch: let the next kernel launch as
    // this one starts.
    let trigger = caps::has_pdl(client) && cubes <= caps::num_sms(client) as usize;
    // SAFETY: every operand was validated above (shapes, dtypes, contiguity); the kernel keeps
    // its accesses within those shapes and clamps the device-side position.
    unsafe {
        let (q_norm, k_norm, eps) = match &norm {
            Some(n) => (
                ComptimeOptionArgs::Some(n.q_weight.as_buffer_arg()),
                ComptimeOptionArgs::Some(n.k_weight.as_buffer_arg()),
                ComptimeOptionArgs::Some(n.eps),
            ),
            None => (
                ComptimeOptionArgs::None,
                ComptimeOptionArgs::None,
                ComptimeOptionArgs::None,
            ),
        };
        qkv_rope_cache_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, cubes as u32),
            CubeDim::new_1d(cube_dim),
            qkv.as_buffer_arg(),
            cos.as_buffer_arg(),
            sin.as_buffer_arg(),
            start.as_buffer_arg(),
            q_out.as_buffer_arg(),
            k_cache.as_buffer_arg(),
            v_cache.as_buffer_arg(),
            q_norm,
            k_norm,
            eps,
            tokens,
            q_heads,
            kv_heads,
            head_dim,
            max_len / caches.slots.unwrap_or(1),
            cos.shape()[0],
            caches.slots.is_some() as u32,
            caches.slots.unwrap_or(1),
            norm.is_some(),
            plan,
            trigger,
            qkv.dtype().elem_type(),
        );
    }
    Ok(())
}

fn check_norm<R: Runtime>(
    op: &'static str,
    qkv: &DeviceTensor<R>,
    norm: &QkNorm<'_, R>,
    head_dim: usize,
) -> Result<()> {
    for w in [norm.q_weight, norm.k_weight] {
        check_same_dtype(op, qkv, w)?;
        if w.shape() != [head_dim] || !w.is_contiguous() {
            return Err(OpsError::shape(
                op,
                format!(
                    "q/k norm weights must be contiguous [{head_dim}], got {:?}",
                    w.shape()
                ),
            ));
        }
    }
    if !(norm.eps.is_finite() && norm.eps >= 0.0) {
        return Err(OpsError::invalid(
            op,
            format!("norm eps must be finite and >= 0, got {}", norm.eps),
        ));
    }
    Ok(())
}
