//! Scaled dot-product attention with grouped-query heads: prefill (many queries), decode (a few
//! queries against a long cache) and the KV-cache write.
//!
//! Layouts are the model's natural ones, no transposes: `q[Lq, Hq, D]`, `k`/`v` `[Lk, Hkv, D]`,
//! `out[Lq, Hq, D]`, all contiguous. Query head `h` reads KV head `h / (Hq / Hkv)` by indexing
//! (never by copying K/V). With `causal`, query `i` sees key `j` iff `j <= i + Lk - Lq`, which is
//! the usual lower triangle when `Lq == Lk` and "prefill appended to a cache" when `Lq < Lk`.
//!
//! **Batching.** [`attention`] and [`attention_into`] also accept a leading batch dimension on all
//! of `q`, `k`, `v` and `out` (`[B, Lq, Hq, D]` with `[B, Lk, Hkv, D]`): the sequences are
//! independent and have equal lengths. [`attention_cached_into`] serves one sequence (one cache);
//! a batch of caches is served by one call per sequence.
//!
//! **Numerics.** Inputs f32, f16 or bf16 (not bf16 on wgpu); scores, softmax statistics and
//! accumulators in f32 ([`crate::online_softmax`]); the output rounded once to the input dtype.
//!
//! **Kernels** (picked by [`AttentionStrategy::Auto`]):
//! - more than [`DECODE_MAX_QUERIES`] queries, f16/bf16 on a runtime with tensor-core `mma`
//!   (CUDA sm80+), head dim a multiple of 16 up to 128: `prefill.rs`'s FlashAttention-2 kernel on
//!   tensor cores;
//! - up to [`DECODE_MAX_QUERIES`] queries: `decode.rs`'s split-KV flash-decoding, on tensor cores
//!   under the same conditions as prefill (the query heads of a KV head packed into one 16-row
//!   tile), else with plane shuffles where the runtime has plane operations (+ a merge launch
//!   when the keys are split);
//! - anything else (wgpu without plane ops, f32, other head dims): the portable tiled
//!   flash-attention kernel, which also splits long key ranges.
//!
//! **Tuning.** The tensor-core tile shapes are fixed defaults measured on an H100; for
//! benchmark sweeps only, `CUBELLM_ATTN_TUNE="prefill=WARPS,BK;decode=WARPS,BK,CUBES_PER_SM"`
//! overrides them (read once per process; malformed or invalid values are ignored).
//!
//! **Workspace.** When the keys are split, the partials live in a small f32 workspace
//! (`splits x Lq x Hq x (D + 2)`). [`attention_into`] allocates it per call;
//! [`attention_cached_into`] uses the [`AttentionWorkspace`] it is given (an
//! [`OpsError::InvalidArgument`] if too small; `None` allocates per call). The model's decode step
//! passes one, so that it allocates nothing and can be captured as a CUDA graph.

mod decode;
mod kv_cache;
mod prefill;

pub use kv_cache::kv_cache_write_into;

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

use crate::launch::{check_same_dtype, cube_count_1d};
use crate::{caps, DType, DeviceTensor, OpsError, Result};
use decode::{DecodeConfig, MergeConfig, MmaDecodeConfig};
use prefill::{MmaConfigAttn, TiledConfig};

/// The largest head dimension the kernels accept.
pub const MAX_HEAD_DIM: usize = 256;

/// Up to this many queries, attention runs as flash-decoding (keys split across cubes, every
/// query of the group sharing the K/V reads); above it, as prefill (queries tiled across cubes).
pub const DECODE_MAX_QUERIES: usize = 8;

/// The current length of a KV cache (or the start row of a cache write).
pub enum KvLen<'a, R: Runtime> {
    /// Known on the host: validated before launch.
    Host(usize),
    /// A `u32` tensor of shape `[1]` on the device, read by the kernel: the length can change
    /// between replays of a captured CUDA graph. The host cannot validate it; the kernels clamp
    /// it to the cache size.
    Device(&'a DeviceTensor<R>),
}

impl<R: Runtime> Clone for KvLen<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for KvLen<'_, R> {}

/// Which kernel runs. [`AttentionStrategy::Auto`] is what the model uses; the others exist so that
/// tests and benchmarks can exercise each kernel on any runtime that supports it (an unsupported
/// choice is an [`OpsError::UnsupportedFeature`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionStrategy {
    #[default]
    Auto,
    /// The portable shared-memory kernel (any runtime, any float dtype).
    Tiled,
    /// FlashAttention-2 on tensor cores (CUDA `mma`, f16/bf16, D % 16 == 0, D <= 128, scale > 0).
    TensorCore,
    /// Split-KV flash-decoding with plane shuffles (needs plane operations).
    Decode,
    /// Split-KV flash-decoding on tensor cores (same requirements as `TensorCore`).
    TensorCoreDecode,
}

/// `softmax(q·kᵀ·scale [+ causal mask])·v`; see the module docs for shapes and the causal rule.
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

/// [`attention`] into a preallocated `out` with the shape and dtype of `q` (which it may not
/// alias).
pub fn attention_into<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    scale: f32,
    causal: bool,
    out: &DeviceTensor<R>,
) -> Result<()> {
    attention_into_with(client, q, k, v, scale, causal, out, AttentionStrategy::Auto)
}

/// [`attention_into`] with an explicit kernel choice.
#[allow(clippy::too_many_arguments)]
pub fn attention_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    scale: f32,
    causal: bool,
    out: &DeviceTensor<R>,
    strategy: AttentionStrategy,
) -> Result<()> {
    const OP: &str = "attention";
    let p = validate(client, OP, q, k, v, out, scale)?;
    let (batch, lq, hq, d) = p;
    let (lk, hkv) = (k.shape()[k.rank() - 3], k.shape()[k.rank() - 2]);
    if lk == 0 {
        return Err(OpsError::shape(OP, "k and v have no rows"));
    }
    if causal && lq > lk {
        return Err(OpsError::invalid(
            OP,
            format!(
                "causal attention needs Lq <= Lk (got Lq {lq}, Lk {lk}): a query would see no key"
            ),
        ));
    }
    let problem = Problem {
        q,
        k,
        v,
        out,
        batch,
        lq,
        hq,
        hkv,
        d,
        kv_rows: lk,
        len: KvLen::Host(lk),
        causal,
        scale,
        workspace: None,
    };
    run(client, OP, &problem, strategy)
}

/// Causal attention of `q[Lq, Hq, D]` over the first `kv_len` rows of a preallocated cache
/// (`k_cache`, `v_cache`: `[max_len, Hkv, D]`), read in place. Query `i` sees cache row `j` iff
/// `j <= i + kv_len - Lq` (the queries are the last `Lq` positions).
///
/// With [`KvLen::Host`] the host checks `Lq <= kv_len <= max_len`. With [`KvLen::Device`] the
/// kernels read the length when they run; the key split is then sized for `max_len` (splits past
/// the length contribute nothing), a length above `max_len` is clamped to it, and a query that
/// sees no row (length below `Lq`) gets zeros.
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
    attention_cached_into_with(
        client,
        q,
        k_cache,
        v_cache,
        kv_len,
        scale,
        out,
        workspace,
        AttentionStrategy::Auto,
    )
}

/// [`attention_cached_into`] with an explicit kernel choice.
#[allow(clippy::too_many_arguments)]
pub fn attention_cached_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    kv_len: KvLen<'_, R>,
    scale: f32,
    out: &DeviceTensor<R>,
    workspace: Option<&AttentionWorkspace<R>>,
    strategy: AttentionStrategy,
) -> Result<()> {
    const OP: &str = "attention_cached";
    if q.rank() != 3 {
        return Err(OpsError::shape(
            OP,
            format!("q must be [Lq, Hq, D], got {:?}", q.shape()),
        ));
    }
    let (_, lq, hq, d) = validate(client, OP, q, k_cache, v_cache, out, scale)?;
    let (max_len, hkv) = (k_cache.shape()[0], k_cache.shape()[1]);
    if max_len == 0 {
        return Err(OpsError::shape(OP, "the cache has no rows"));
    }
    match kv_len {
        KvLen::Host(len) => {
            if len > max_len || len < lq || len == 0 {
                return Err(OpsError::invalid(
                    OP,
                    format!("kv_len {len} must satisfy Lq ({lq}) <= kv_len <= max_len ({max_len}) and be > 0"),
                ));
            }
        }
        KvLen::Device(t) => check_len_tensor(OP, t)?,
    }
    let problem = Problem {
        q,
        k: k_cache,
        v: v_cache,
        out,
        batch: 1,
        lq,
        hq,
        hkv,
        d,
        kv_rows: max_len,
        len: kv_len,
        causal: true,
        scale,
        workspace,
    };
    run(client, OP, &problem, strategy)
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

/// A 4-byte buffer bound where a kernel declares an argument this launch does not use (a device
/// length when the length is on the host, a partial buffer when there is one split).
pub(crate) fn dummy_u32<R: Runtime>(client: &ComputeClient<R>) -> DeviceTensor<R> {
    DeviceTensor::empty(client, &[1], DType::U32)
}

/// Validates dtypes, ranks and shapes shared by the attention entry points; returns
/// `(batch, Lq, Hq, D)`.
fn validate<R: Runtime>(
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

/// A validated attention problem.
pub(crate) struct Problem<'a, R: Runtime> {
    pub q: &'a DeviceTensor<R>,
    pub k: &'a DeviceTensor<R>,
    pub v: &'a DeviceTensor<R>,
    pub out: &'a DeviceTensor<R>,
    pub batch: usize,
    pub lq: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Rows of k/v per sequence (Lk, or the cache's max_len).
    pub kv_rows: usize,
    pub len: KvLen<'a, R>,
    pub causal: bool,
    pub scale: f32,
    /// Where the split partials go; `None` allocates them per call.
    pub workspace: Option<&'a AttentionWorkspace<R>>,
}

impl<R: Runtime> Problem<'_, R> {
    fn group(&self) -> usize {
        self.hq / self.hkv
    }

    /// The most keys any launch of this problem can see: sizes the key split.
    fn max_len(&self) -> usize {
        match self.len {
            KvLen::Host(l) => l,
            KvLen::Device(_) => self.kv_rows,
        }
    }

    fn len_host(&self) -> u32 {
        match self.len {
            KvLen::Host(l) => l as u32,
            KvLen::Device(_) => 0,
        }
    }

    fn device_len(&self) -> bool {
        matches!(self.len, KvLen::Device(_))
    }

    fn rows_out(&self) -> usize {
        self.batch * self.lq * self.hq
    }
}

/// The kernel a problem runs with.
enum Plan {
    Tiled(TiledConfig),
    TensorCore(MmaConfigAttn),
    Decode(DecodeConfig),
    TensorCoreDecode(MmaDecodeConfig),
}

fn mma_supported<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    let kind = match dtype {
        DType::F16 => FloatKind::F16,
        DType::BF16 => FloatKind::BF16,
        _ => return false,
    };
    client.features().matmul.mma.contains(&MmaConfig {
        a_type: ElemType::Float(kind),
        b_type: ElemType::Float(kind),
        cd_type: ElemType::Float(FloatKind::F32),
        m: 16,
        n: 8,
        k: 16,
    }) && caps::has_plane_ops(client)
        && caps::plane_size_min(client) == 32
        && client.properties().hardware.plane_size_max == 32
}

fn shared_budget<R: Runtime>(client: &ComputeClient<R>) -> usize {
    client.properties().hardware.max_shared_memory_size
}

/// The benchmark-only overrides described in the module docs.
#[derive(Default)]
struct Tuning {
    prefill: Option<(usize, usize)>,
    decode: Option<(usize, usize, usize)>,
}

fn tuning() -> &'static Tuning {
    static TUNING: std::sync::OnceLock<Tuning> = std::sync::OnceLock::new();
    TUNING.get_or_init(|| {
        let mut t = Tuning::default();
        let Ok(spec) = std::env::var("CUBELLM_ATTN_TUNE") else {
            return t;
        };
        for part in spec.split(';') {
            let Some((key, vals)) = part.split_once('=') else {
                continue;
            };
            let v: Vec<usize> = vals
                .split(',')
                .filter_map(|x| x.trim().parse().ok())
                .collect();
            let warps_ok = |w: usize| matches!(w, 1 | 2 | 4 | 8);
            match (key.trim(), v.as_slice()) {
                ("prefill", &[w, bk])
                    if warps_ok(w) && bk % 16 == 0 && (16..=128).contains(&bk) =>
                {
                    t.prefill = Some((w, bk))
                }
                ("decode", &[w, bk, c])
                    if warps_ok(w) && bk % (16 * w) == 0 && bk <= 128 && (1..=8).contains(&c) =>
                {
                    t.decode = Some((w, bk, c))
                }
                _ => {}
            }
        }
        t
    })
}

fn tensor_core_plan<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> Option<Plan> {
    let dtype = p.q.dtype();
    // The kernel keeps row maxima in raw score units, which needs a positive scale.
    if !mma_supported(client, dtype) || !p.d.is_multiple_of(16) || p.d > 128 || p.scale <= 0.0 {
        return None;
    }
    let mut cfg = MmaConfigAttn::new(p.d, p.causal, p.device_len());
    if let Some((warps, bk)) = tuning().prefill {
        cfg.warps = warps;
        cfg.bk = bk;
    }
    (cfg.shared_bytes(dtype.size()) <= shared_budget(client)).then_some(Plan::TensorCore(cfg))
}

fn tensor_core_decode_plan<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
) -> Option<Plan> {
    let dtype = p.q.dtype();
    if !mma_supported(client, dtype) || !p.d.is_multiple_of(16) || p.d > 128 || p.scale <= 0.0 {
        return None;
    }
    let mut cfg = MmaDecodeConfig::new(p.d, p.causal, p.device_len());
    if let Some((warps, bk, _)) = tuning().decode {
        cfg.warps = warps;
        cfg.bk = bk;
    }
    (cfg.shared_bytes(dtype.size()) <= shared_budget(client)).then_some(Plan::TensorCoreDecode(cfg))
}

fn decode_plan<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> Option<Plan> {
    let dtype = p.q.dtype();
    let plane = caps::plane_size_min(client) as usize;
    if !caps::has_plane_ops(client)
        || client.properties().hardware.plane_size_max as usize != plane
        || plane < 4
    {
        return None;
    }
    let n = caps::vector_size_for(client, dtype, p.d);
    let lpk = p.d / n;
    if !lpk.is_power_of_two() || lpk > plane {
        return None;
    }
    let rows_total = p.lq * p.group();
    let blocks = rows_total.div_ceil(8);
    let rows = rows_total.div_ceil(blocks);
    let units = 256usize.min(client.properties().hardware.max_units_per_cube as usize);
    if !units.is_multiple_of(plane) || units < plane || rows * lpk > units {
        return None;
    }
    let cfg = DecodeConfig {
        d: p.d,
        n,
        rows,
        unroll: 4,
        units,
        plane,
        causal: p.causal,
        device_len: p.device_len(),
        partial: false,
    };
    (cfg.shared_bytes() <= shared_budget(client)).then_some(Plan::Decode(cfg))
}

fn tiled_plan<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> Result<Plan> {
    let budget = shared_budget(client);
    let elem = p.q.dtype().size();
    for bk in [32, 16, 8] {
        let cfg = TiledConfig {
            d: p.d,
            br: 16,
            bk,
            upr: 8,
            causal: p.causal,
            device_len: p.device_len(),
            partial: false,
        };
        if cfg.shared_bytes(elem) <= budget {
            return Ok(Plan::Tiled(cfg));
        }
    }
    Err(OpsError::UnsupportedFeature {
        op: "attention",
        runtime: caps::runtime_name(client),
        feature: format!(
            "{budget} bytes of shared memory per cube are too few for head dim {}",
            p.d
        ),
    })
}

fn plan<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    strategy: AttentionStrategy,
) -> Result<Plan> {
    let unsupported = |what: &str| OpsError::UnsupportedFeature {
        op,
        runtime: caps::runtime_name(client),
        feature: what.to_string(),
    };
    match strategy {
        AttentionStrategy::Auto => {
            let fast = if p.lq > DECODE_MAX_QUERIES {
                tensor_core_plan(client, p)
            } else {
                tensor_core_decode_plan(client, p).or_else(|| decode_plan(client, p))
            };
            match fast {
                Some(plan) => Ok(plan),
                None => tiled_plan(client, p),
            }
        }
        AttentionStrategy::Tiled => tiled_plan(client, p),
        AttentionStrategy::TensorCore => tensor_core_plan(client, p).ok_or_else(|| {
            unsupported("tensor-core attention (mma f16/bf16 m16n8k16, head dim % 16 == 0, <= 128)")
        }),
        AttentionStrategy::Decode => decode_plan(client, p)
            .ok_or_else(|| unsupported("split-KV decoding (plane operations of a fixed size)")),
        AttentionStrategy::TensorCoreDecode => {
            tensor_core_decode_plan(client, p).ok_or_else(|| {
                unsupported(
                    "tensor-core decoding (mma f16/bf16 m16n8k16, head dim % 16 == 0, <= 128)",
                )
            })
        }
    }
}

/// How many cubes share the keys of one (sequence, row block, KV head): enough cubes to cover the
/// device (`target`), never a chunk shorter than one step of the kernel.
fn split_plan(max_len: usize, step: usize, cubes: usize, target: usize) -> (usize, usize) {
    let want = target.div_ceil(cubes.max(1)).max(1);
    let most = max_len.div_ceil(step).max(1);
    let s = want.min(most);
    let chunk = max_len.div_ceil(s).div_ceil(step) * step;
    (max_len.div_ceil(chunk).max(1), chunk)
}

/// Preallocated room for the split partials of [`attention_cached_into`], so that a decode step
/// allocates nothing (a requirement of CUDA graph capture).
pub struct AttentionWorkspace<R: Runtime> {
    acc: DeviceTensor<R>,
    stats: DeviceTensor<R>,
    rows: usize,
    d: usize,
}

impl<R: Runtime> AttentionWorkspace<R> {
    /// Room for `rows` partial output rows (splits x query rows x query heads) of head dim `d`.
    pub fn new(client: &ComputeClient<R>, rows: usize, d: usize) -> Self {
        let rows = rows.max(1);
        Self {
            acc: DeviceTensor::empty(client, &[rows * d.max(1)], DType::F32),
            stats: DeviceTensor::empty(client, &[rows * 2], DType::F32),
            rows,
            d,
        }
    }

    /// A workspace large enough for every call with up to `q_len` query tokens of `q_heads`
    /// heads and head dim `head_dim` over at most `max_len` keys, whatever kernel runs.
    pub fn for_shapes(
        client: &ComputeClient<R>,
        q_len: usize,
        q_heads: usize,
        _kv_heads: usize,
        head_dim: usize,
        max_len: usize,
    ) -> Self {
        // Every kernel asks `split_plan` for at most `split_target` cubes, and a split holds at
        // least one step of 8 keys.
        let splits = split_target(client).min(max_len.div_ceil(8)).max(1);
        Self::new(client, splits * q_len.max(1) * q_heads.max(1), head_dim)
    }
}

/// The largest number of cubes any kernel's split plan aims for.
fn split_target<R: Runtime>(client: &ComputeClient<R>) -> usize {
    let per_sm = tuning().decode.map_or(1, |(_, _, c)| c).max(2);
    per_sm * caps::num_sms(client) as usize
}

/// The f32 partials of a split launch (a workspace's buffers, or buffers allocated for this call;
/// with one split they are bound but never touched).
enum Partials<'a, R: Runtime> {
    Owned {
        acc: DeviceTensor<R>,
        stats: DeviceTensor<R>,
    },
    Borrowed(&'a AttentionWorkspace<R>),
}

impl<'a, R: Runtime> Partials<'a, R> {
    fn new(
        client: &ComputeClient<R>,
        op: &'static str,
        p: &Problem<'a, R>,
        splits: usize,
    ) -> Result<Self> {
        let rows = splits * p.rows_out();
        if let Some(ws) = p.workspace {
            if splits > 1 && (ws.rows < rows || ws.d != p.d) {
                return Err(OpsError::invalid(
                    op,
                    format!(
                        "workspace for {} rows of dim {} is too small ({rows} rows of dim {} needed)",
                        ws.rows, ws.d, p.d
                    ),
                ));
            }
            return Ok(Partials::Borrowed(ws));
        }
        let (acc, stats) = if splits > 1 {
            (rows * p.d, rows * 2)
        } else {
            (1, 1)
        };
        Ok(Partials::Owned {
            acc: DeviceTensor::empty(client, &[acc], DType::F32),
            stats: DeviceTensor::empty(client, &[stats], DType::F32),
        })
    }

    fn acc(&self) -> &DeviceTensor<R> {
        match self {
            Partials::Owned { acc, .. } => acc,
            Partials::Borrowed(ws) => &ws.acc,
        }
    }

    fn stats(&self) -> &DeviceTensor<R> {
        match self {
            Partials::Owned { stats, .. } => stats,
            Partials::Borrowed(ws) => &ws.stats,
        }
    }
}

fn run<'a, R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'a, R>,
    strategy: AttentionStrategy,
) -> Result<()> {
    let plan = plan(client, op, p, strategy)?;
    let dummy;
    let len_t = match p.len {
        KvLen::Device(t) => t,
        KvLen::Host(_) => {
            dummy = dummy_u32(client);
            &dummy
        }
    };
    let sms = caps::num_sms(client) as usize;
    let dtype = p.q.dtype().elem_type();
    match plan {
        Plan::TensorCore(cfg) => {
            prefill::launch_mma(client, p, len_t, cfg);
        }
        Plan::Tiled(mut cfg) => {
            let row_blocks = (p.lq * p.group()).div_ceil(cfg.br);
            let cubes = row_blocks * p.hkv * p.batch;
            let (splits, chunk) = split_plan(p.max_len(), cfg.bk, cubes, 2 * sms);
            cfg.partial = splits > 1;
            let parts = Partials::new(client, op, p, splits)?;
            unsafe {
                prefill::tiled_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(row_blocks as u32, p.hkv as u32, (p.batch * splits) as u32),
                    CubeDim::new_1d(cfg.units()),
                    p.q.as_buffer_arg(),
                    p.k.as_buffer_arg(),
                    p.v.as_buffer_arg(),
                    len_t.as_buffer_arg(),
                    p.out.as_buffer_arg(),
                    parts.acc().as_buffer_arg(),
                    parts.stats().as_buffer_arg(),
                    p.len_host(),
                    p.lq as u32,
                    p.hq as u32,
                    p.hkv as u32,
                    p.group() as u32,
                    p.kv_rows as u32,
                    chunk as u32,
                    splits as u32,
                    row_blocks as u32,
                    p.scale,
                    cfg,
                    dtype,
                );
            }
            if splits > 1 {
                merge(client, p, &parts, splits);
            }
        }
        Plan::Decode(mut cfg) => {
            let row_blocks = (p.lq * p.group()).div_ceil(cfg.rows);
            let cubes = row_blocks * p.hkv * p.batch;
            let (splits, chunk) = split_plan(p.max_len(), cfg.keys_per_step(), cubes, sms);
            cfg.partial = splits > 1;
            let parts = Partials::new(client, op, p, splits)?;
            unsafe {
                decode::decode_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(splits as u32, p.hkv as u32, (p.batch * row_blocks) as u32),
                    CubeDim::new_1d(cfg.units as u32),
                    cfg.n,
                    p.q.as_buffer_arg(),
                    p.k.as_buffer_arg(),
                    p.v.as_buffer_arg(),
                    len_t.as_buffer_arg(),
                    p.out.as_buffer_arg(),
                    parts.acc().as_buffer_arg(),
                    parts.stats().as_buffer_arg(),
                    p.len_host(),
                    p.lq as u32,
                    p.hq as u32,
                    p.hkv as u32,
                    p.group() as u32,
                    p.kv_rows as u32,
                    chunk as u32,
                    splits as u32,
                    row_blocks as u32,
                    p.scale,
                    cfg,
                    dtype,
                );
            }
            if splits > 1 {
                merge(client, p, &parts, splits);
            }
        }
        Plan::TensorCoreDecode(mut cfg) => {
            let row_blocks = (p.lq * p.group()).div_ceil(16);
            let cubes = row_blocks * p.hkv * p.batch;
            // One cube per SM measured best at L = 32768 on the H100 (18.3 µs graph-replayed
            // against 20.1 µs with two): fewer, longer cubes pay the pipeline prologue and the
            // cross-plane merge less often.
            let per_sm = tuning().decode.map_or(1, |(_, _, c)| c);
            let (splits, chunk) = split_plan(p.max_len(), cfg.bk, cubes, per_sm * sms);
            cfg.partial = splits > 1;
            let parts = Partials::new(client, op, p, splits)?;
            unsafe {
                decode::mma_decode_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(splits as u32, p.hkv as u32, (p.batch * row_blocks) as u32),
                    CubeDim::new_1d((32 * cfg.warps) as u32),
                    p.q.as_buffer_arg(),
                    p.k.as_buffer_arg(),
                    p.v.as_buffer_arg(),
                    len_t.as_buffer_arg(),
                    p.out.as_buffer_arg(),
                    parts.acc().as_buffer_arg(),
                    parts.stats().as_buffer_arg(),
                    p.len_host(),
                    p.lq as u32,
                    p.hq as u32,
                    p.hkv as u32,
                    p.group() as u32,
                    p.kv_rows as u32,
                    chunk as u32,
                    splits as u32,
                    row_blocks as u32,
                    p.scale,
                    cfg,
                    dtype,
                );
            }
            if splits > 1 {
                merge(client, p, &parts, splits);
            }
        }
    }
    Ok(())
}

fn merge<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    parts: &Partials<'_, R>,
    splits: usize,
) {
    let cfg = MergeConfig::new(client, p.d, splits);
    let rows_out = p.rows_out();
    unsafe {
        decode::merge_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, rows_out as u32),
            CubeDim::new_1d(cfg.units()),
            parts.acc().as_buffer_arg(),
            parts.stats().as_buffer_arg(),
            p.out.as_buffer_arg(),
            splits as u32,
            rows_out as u32,
            cfg,
            p.q.dtype().elem_type(),
        );
    }
}
