//! Token sampling on the device: repetition penalty, temperature, top-k, top-p and the draw,
//! writing one u32 token id per row.
//!
//! # Why
//!
//! Greedy decoding already ends on the device ([`crate::argmax`]); sampling used to read the
//! logits back and sort them on the host: for a 151,936-token vocabulary that is 304 KB of bf16
//! logits copied and converted every token, then a partial sort. Sampled decode of the 1.5B
//! shape on an H100 ran 79 tok/s with top-p 0.95 and 289 tok/s with top-k 50 against about
//! 700 greedy: 11 ms and 2 ms a token outside the model, whose step takes 1.4 ms. Here the
//! choice stays on the device and the host reads one u32.
//!
//! # Semantics
//!
//! The host sampler's (`model::sampling`; transformers' order), row by row: the repetition
//! penalty divides positive and multiplies negative logits of the tokens in the row's presence
//! mask; temperature 0 (or top-k 1) picks the first maximum; otherwise top-k keeps the `k`
//! largest (0 disables it, `k` at or above the number of candidates keeps all), top-p keeps the
//! smallest prefix of those, largest first, whose probability (renormalised over the top-k set)
//! reaches `top_p` (1 disables it; at least one is kept), and the draw walks the kept ids in
//! ascending id order, taking the first whose cumulative probability (renormalised over the
//! kept set) exceeds the row's uniform `u` in `[0, 1)`. Ties in value are broken by the lower
//! id everywhere; NaN and `-inf` logits are never chosen (a row of only those gives
//! `u32::MAX`). [`crate::reference::sampling`] is the f64 statement of the same rules.
//!
//! # How: no sort
//!
//! Each logit becomes an order-preserving u32 key (larger logit, smaller key) and a weight
//! `exp((l - max) / T)` held as a fixed-point mass (two u32 limbs, about 2^-35 of the maximum's
//! weight per unit). The top-k and top-p boundaries are found by radix selection: 4 passes of 8
//! bits each (2 for bf16 logits and 3 for f16 when no row applies the penalty: the keys' lower
//! digits are then the same for every logit of a sign), every pass one multi-cube kernel that
//! histograms the keys in the current prefix's range (count and mass per bin, shared-memory
//! atomics, then global atomics); the next launch finds (in every cube, from the same integers)
//! the bin where the target count (`k`) or mass (`top_p * Z`) falls, and narrows the prefix to
//! it. Ties at a boundary are kept in id order, counted arithmetically. The draw then needs no
//! order of the kept set beyond ids: one kernel sums each cube's kept mass, a last one-cube
//! kernel finds the cube and then the id where `u * Z` falls.
//!
//! That is `prepare` (which also marks the step's token in the presence mask, with
//! [`mark_and_sample_into`]), the histogram passes of the searches some row needs
//! ([`SamplingPlan`]: 4 for top-k, 4 for top-p), a final stage that sums each cube's kept mass,
//! and the draw: 11 launches with top-k and top-p, 7 with one of them (5 over bf16 logits without
//! the penalty), 3 for temperature alone or greedy with the penalty. A row whose parameters
//! switch a launched search off skips its passes. Each multi-cube kernel runs `ceil(V / 1024)`
//! cubes of 256 units per row (149 for Qwen2's vocabulary).
//!
//! # The small-top-k plan
//!
//! Where every row's top-k is small ([`small_top_k_limit`]: 109 for Qwen2), the top-k set under
//! the order (key, id) lies among each chunk's own top-k: one kernel keys a chunk of 2,048 ids
//! per cube and selects its top-k by the same radix search in shared memory, and one cube per
//! row then selects the row's top-k among those candidates (no larger than the smallest of the
//! chunks' k-th keys), orders that set by value for top-p and draws from it in id order: 2
//! launches instead of 11, the same masses and the same tokens ([`SamplingPlan`] picks it where
//! both searches run).
//!
//! Measured on an H100 (`lab samplelab`, one row of 151,936 bf16 logits, replayed from a CUDA
//! graph): 12 µs for greedy with the penalty, 13 µs for temperature alone, 21 µs with top-k,
//! 24 µs with top-p (31 with the penalty), 29 µs with both on the small-top-k plan (42 on the
//! radix plan with the penalty); the argmax: 9 µs eagerly; copying the logits to the host:
//! 230 µs. Sampled decode of the 1.5B shape runs at 0.96 to 0.98 of greedy's tok/s, against
//! 0.10 with the host sampler (top-p 0.95, H200); the raw lines are in
//! `dev/results/sampling-h200/` and `dev/results/decode-profile/2026-12-05-h100-s34/`.
//!
//! # Determinism
//!
//! Every sum is an integer sum (counts and fixed-point masses), exact whatever order the
//! atomics land in, and every float is computed from a key by the same code in every kernel; so
//! the same logits and the same `u` give the same token on a runtime, every run. The only
//! rounding is the weight's (f32 `exp`, then to fixed point) and the targets' (`top_p * Z`,
//! `u * Z` in f32): a token is chosen differently from an f64 computation only when `u` (or
//! `top_p`) is within rounding (a few 1e-6 at most; the tests allow 2e-5) of a boundary of the
//! cumulative distribution.
//!
//! # Device buffers
//!
//! The parameters ([`SamplingInputs::write_params`]), the uniforms
//! ([`SamplingInputs::write_uniforms`]) and the presence mask (filled from a context on the
//! host, [`SamplingInputs::fill_presence`], or bit by bit on the device,
//! [`presence_mark_into`]) are device buffers, not launch arguments, and [`sample_into`] uses
//! only the preallocated [`SamplingWorkspace`]: a captured CUDA graph of it replays with new
//! values (of the same [`SamplingPlan`]).

mod fixed;
mod kernels;
mod small_k;

use cubecl::ir::features::AtomicUsage;
use cubecl::prelude::*;

use crate::launch::{check_u32_ids, validate_rows};
use crate::{caps, DType, DeviceTensor, OpsError, Result};
use kernels::{
    CHUNK, CUBE, FINAL, HIST_WORDS, MODE_TOPK, MODE_TOPP, NO_STAGE, PARAM_WORDS, PASSES, REC,
    STAGES,
};

/// The largest vocabulary the fixed-point sums are sized for.
pub const MAX_VOCAB: usize = 1 << 20;
/// The most rows one launch takes (the cube count along y).
pub const MAX_ROWS: usize = 65_535;

/// One row's sampling parameters (the host sampler's, without the seed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowParams {
    /// 0 means greedy (the first maximum after the penalty).
    pub temperature: f32,
    /// Keep the `top_k` largest; 0 disables.
    pub top_k: u32,
    /// Keep the smallest prefix reaching this probability, in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Divides positive and multiplies negative logits of the tokens in the presence mask;
    /// 1 disables.
    pub repetition_penalty: f32,
}

impl RowParams {
    /// Greedy decoding, no penalty.
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        repetition_penalty: 1.0,
    };

    /// Errors on values without a meaning: a negative or non-finite temperature, a top-p
    /// outside (0, 1], a penalty that is not a positive finite number.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(OpsError::invalid(
                op,
                format!("temperature {} must be finite and >= 0", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(OpsError::invalid(
                op,
                format!("top_p {} must be in (0, 1]", self.top_p),
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(OpsError::invalid(
                op,
                format!(
                    "repetition_penalty {} must be finite and > 0",
                    self.repetition_penalty
                ),
            ));
        }
        Ok(())
    }

    fn words(&self) -> [u32; PARAM_WORDS as usize] {
        [
            self.temperature.to_bits(),
            self.top_k,
            self.top_p.to_bits(),
            self.repetition_penalty.to_bits(),
        ]
    }
}

/// Which launches the sampler makes. With `small_k`, two: each chunk of the vocabulary's own
/// top-k, then the row's top-k, top-p and the draw over those candidates in one cube (it serves
/// rows whose top-k is in `2..=`[`small_top_k_limit`], and greedy rows). Otherwise the radix
/// plan over the whole vocabulary, whose top-k and top-p searches are 4 histogram passes each,
/// launched only when a row may need them (a row whose parameters switch one off skips its
/// passes on the device, which still costs the launches). Both plans keep the same set and draw
/// the same token. The plan follows from the parameters the host wrote
/// ([`SamplingInputs::plan`]); a captured graph of [`sample_into`] replays with any parameters
/// of the same plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct SamplingPlan {
    pub top_k: bool,
    pub top_p: bool,
    pub small_k: bool,
    /// Some row applies the repetition penalty. Without it a key holds only the logit's own
    /// significant bits, and the radix plan's searches take 2 passes for bf16 logits and 3 for
    /// f16 instead of 4.
    pub penalty: bool,
}

/// The largest top-k of the small-top-k plan for a vocabulary of `vocab` (109 for Qwen2's
/// 151,936): the candidates of every chunk must fit the final cube's registers, and its ordering
/// of the top-k set takes one element per unit.
pub fn small_top_k_limit(vocab: usize) -> usize {
    let chunks = vocab.max(1).div_ceil(small_k::LOCAL_CHUNK as usize);
    (small_k::SLOTS as usize / chunks).min(small_k::MAX_K as usize)
}

/// Whether the small-top-k plan serves every row of `params` over a vocabulary of `vocab`:
/// every sampled row's top-k is in `2..=`[`small_top_k_limit`] (greedy rows always are).
pub fn small_top_k_serves(params: &[RowParams], vocab: usize) -> bool {
    let limit = small_top_k_limit(vocab);
    params
        .iter()
        .filter(|p| p.temperature > 0.0 && p.top_k != 1)
        .all(|p| p.top_k >= 2 && p.top_k as usize <= limit)
}

impl SamplingPlan {
    /// The launches for the rows of `params` over a vocabulary of `vocab`: the searches they
    /// need (none for greedy rows, temperature 0 or top-k 1), on the small-top-k plan where it
    /// serves them and they need both searches. That is where it measured faster on an H100
    /// (one row of 151,936 bf16 logits replayed from a CUDA graph, top-k 50 and top-p 0.95:
    /// 28.4 against 41.7 µs with the penalty, 28.6 against 28.8 without); against the radix
    /// plan's launches of one search or none it was as fast or slower (top-k 50 alone: 28.5
    /// against 21.0 µs over bf16 logits).
    pub fn for_params(params: &[RowParams], vocab: usize) -> Self {
        let sampled = |p: &&RowParams| p.temperature > 0.0 && p.top_k != 1;
        let top_k = params.iter().filter(sampled).any(|p| p.top_k > 0);
        let top_p = params.iter().filter(sampled).any(|p| p.top_p < 1.0);
        Self {
            top_k,
            top_p,
            small_k: top_k && top_p && small_top_k_serves(params, vocab),
            penalty: params.iter().any(|p| p.repetition_penalty != 1.0),
        }
    }

    /// Whether a launch of `self` serves rows that need the searches of `needed`, of which the
    /// small-top-k plan serves them (`small_ok`) or not.
    fn serves(self, needed: Self, small_ok: bool) -> bool {
        if self.small_k {
            small_ok
        } else {
            (self.top_k || !needed.top_k)
                && (self.top_p || !needed.top_p)
                && (self.penalty || !needed.penalty)
        }
    }

    /// The radix searches' passes for logits of `dtype`: the 8-bit digits of a key that vary
    /// (a bf16 or f16 logit widened to f32 has its low 16 or 13 bits clear, so its key's low
    /// digits are the same for every logit of a sign; a penalised logit can have any bits).
    fn passes(self, dtype: DType) -> u32 {
        match dtype {
            DType::BF16 if !self.penalty => 2,
            DType::F16 if !self.penalty => 3,
            _ => PASSES,
        }
    }

    /// The stage kernel's launches: each top-k pass, each top-p pass, then the final stage.
    fn stages(self, passes: u32) -> Vec<u32> {
        let mut kinds = Vec::with_capacity(STAGES as usize + 1);
        if self.top_k {
            kinds.extend(0..passes);
        }
        if self.top_p {
            kinds.extend(PASSES..PASSES + passes);
        }
        kinds.push(FINAL);
        kinds
    }

    fn mode_bits(self) -> u32 {
        (if self.top_k { MODE_TOPK } else { 0 }) | (if self.top_p { MODE_TOPP } else { 0 })
    }
}

/// u32 words of a presence mask row.
fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

fn check_geometry(op: &'static str, rows: usize, vocab: usize) -> Result<()> {
    if rows == 0 || rows > MAX_ROWS {
        return Err(OpsError::invalid(
            op,
            format!("{rows} rows (must be 1..={MAX_ROWS})"),
        ));
    }
    if vocab == 0 || vocab > MAX_VOCAB {
        return Err(OpsError::invalid(
            op,
            format!("vocabulary of {vocab} (must be 1..={MAX_VOCAB})"),
        ));
    }
    Ok(())
}

/// What the sampler reads besides the logits, as device buffers written by the host between
/// launches (so that a captured graph replays with new values):
///
/// | buffer | shape | dtype | written |
/// |---|---|---|---|
/// | `params` | `[rows, 4]` | u32 | [`Self::write_params`]: temperature, top-k, top-p, penalty (floats as bits) |
/// | `uniform` | `[rows]` | f32 | [`Self::write_uniforms`], every step |
/// | `presence` | `[rows, ceil(V / 32)]` | u32 | [`Self::fill_presence`], [`presence_mark_into`]: bit `i` = token `i` is in the context |
pub struct SamplingInputs<R: Runtime> {
    pub params: DeviceTensor<R>,
    pub uniform: DeviceTensor<R>,
    pub presence: DeviceTensor<R>,
    rows: usize,
    vocab: usize,
    plan: SamplingPlan,
    /// The plan of the parameters written last ([`SamplingPlan::for_params`]), and whether the
    /// small-top-k plan serves them.
    needed: SamplingPlan,
    small_ok: bool,
}

impl<R: Runtime> SamplingInputs<R> {
    /// Buffers for `rows` rows of `vocab` logits: greedy parameters, uniforms 0, empty masks.
    pub fn new(client: &ComputeClient<R>, rows: usize, vocab: usize) -> Result<Self> {
        check_geometry("SamplingInputs::new", rows, vocab)?;
        let params: Vec<u32> = (0..rows).flat_map(|_| RowParams::GREEDY.words()).collect();
        Ok(Self {
            params: DeviceTensor::from_slice(client, &params, &[rows, PARAM_WORDS as usize])?,
            uniform: DeviceTensor::from_slice(client, &vec![0f32; rows], &[rows])?,
            presence: DeviceTensor::from_slice(
                client,
                &vec![0u32; rows * mask_words(vocab)],
                &[rows, mask_words(vocab)],
            )?,
            rows,
            vocab,
            plan: SamplingPlan::for_params(&[RowParams::GREEDY], vocab),
            needed: SamplingPlan::for_params(&[RowParams::GREEDY], vocab),
            small_ok: true,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The launches [`sample_into`] makes: those the parameters written last need
    /// ([`SamplingPlan::for_params`]) unless [`Self::set_plan`] chose others.
    pub fn plan(&self) -> SamplingPlan {
        self.plan
    }

    /// Chooses the launches for the parameters written last (until the next
    /// [`Self::write_params`]), e.g. the radix plan where the small-top-k plan would run, or
    /// the other way round: both draw the same tokens, so this is for comparing them. Errors
    /// when the plan does not serve the parameters (a search they need is off, or a top-k
    /// beyond the small plan's).
    pub fn set_plan(&mut self, plan: SamplingPlan) -> Result<()> {
        if !plan.serves(self.needed, self.small_ok) {
            return Err(OpsError::invalid(
                "SamplingInputs::set_plan",
                format!(
                    "{plan:?} does not serve the parameters, which need {:?}",
                    self.needed
                ),
            ));
        }
        self.plan = plan;
        Ok(())
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Writes every row's parameters (one per row, validated) and plans the launches for them.
    pub fn write_params(&mut self, client: &ComputeClient<R>, params: &[RowParams]) -> Result<()> {
        const OP: &str = "SamplingInputs::write_params";
        if params.len() != self.rows {
            return Err(OpsError::shape(
                OP,
                format!("{} parameter rows for {} rows", params.len(), self.rows),
            ));
        }
        for p in params {
            p.validate(OP)?;
        }
        let words: Vec<u32> = params.iter().flat_map(RowParams::words).collect();
        self.params
            .write_bytes(client, bytemuck::cast_slice(&words))?;
        self.needed = SamplingPlan::for_params(params, self.vocab);
        self.small_ok = small_top_k_serves(params, self.vocab);
        self.plan = self.needed;
        Ok(())
    }

    /// Writes every row's uniform in `[0, 1)` (rounded down to f32, so it stays below 1).
    pub fn write_uniforms(&self, client: &ComputeClient<R>, u: &[f64]) -> Result<()> {
        const OP: &str = "SamplingInputs::write_uniforms";
        if u.len() != self.rows {
            return Err(OpsError::shape(
                OP,
                format!("{} uniforms for {} rows", u.len(), self.rows),
            ));
        }
        let mut values = Vec::with_capacity(u.len());
        for &x in u {
            if !(0.0..1.0).contains(&x) {
                return Err(OpsError::invalid(
                    OP,
                    format!("uniform {x} is not in [0, 1)"),
                ));
            }
            let mut f = x as f32;
            if f as f64 > x {
                f = f32::from_bits(f.to_bits() - 1);
            }
            values.push(f);
        }
        self.uniform
            .write_bytes(client, bytemuck::cast_slice(&values))
    }

    /// Sets each row's presence mask to the distinct ids of its context (ids outside the
    /// vocabulary are ignored, as the host penalty ignores them).
    pub fn fill_presence(&self, client: &ComputeClient<R>, contexts: &[&[u32]]) -> Result<()> {
        if contexts.len() != self.rows {
            return Err(OpsError::shape(
                "SamplingInputs::fill_presence",
                format!("{} contexts for {} rows", contexts.len(), self.rows),
            ));
        }
        let words = mask_words(self.vocab);
        let mut mask = vec![0u32; self.rows * words];
        for (row, context) in contexts.iter().enumerate() {
            for &id in context.iter() {
                let i = id as usize;
                if i < self.vocab {
                    mask[row * words + i / 32] |= 1 << (i % 32);
                }
            }
        }
        self.presence
            .write_bytes(client, bytemuck::cast_slice(&mask))
    }
}

/// The sampler's scratch buffers for `rows` rows of `vocab` logits, allocated once so that
/// [`sample_into`] allocates nothing.
///
/// | buffer | shape | role |
/// |---|---|---|
/// | `keys` | `[rows, V]` | each logit's order-preserving key after the penalty |
/// | `partial_min` | `[rows, cubes]` | each cube's smallest key (the row's maximum) |
/// | `hist` | `[rows, 8, 3, 256]` | the stages' histograms: count and mass per bin |
/// | `records` | `[rows, 9, 15]` | the searches' state after each launch, then the kept set |
/// | `partials` | `[rows, cubes, 3]` | each cube's ties at the kept set's boundary and mass below it |
/// | `cand_keys`, `cand_ids` | `[rows, 8192]` | the small-top-k plan's candidates: each chunk's top-k |
/// | `bounds` | `[rows, chunks]` | each chunk's k-th key |
pub struct SamplingWorkspace<R: Runtime> {
    keys: DeviceTensor<R>,
    partial_min: DeviceTensor<R>,
    hist: DeviceTensor<R>,
    records: DeviceTensor<R>,
    partials: DeviceTensor<R>,
    cand_keys: DeviceTensor<R>,
    cand_ids: DeviceTensor<R>,
    bounds: DeviceTensor<R>,
    rows: usize,
    vocab: usize,
    cubes: usize,
    /// The small-top-k plan's chunks of `small_k::LOCAL_CHUNK` ids and candidate slots per
    /// chunk ([`small_top_k_limit`]).
    chunks: usize,
    stride: usize,
}

impl<R: Runtime> SamplingWorkspace<R> {
    pub fn new(client: &ComputeClient<R>, rows: usize, vocab: usize) -> Result<Self> {
        check_geometry("SamplingWorkspace::new", rows, vocab)?;
        let cubes = vocab.div_ceil(CHUNK as usize);
        let chunks = vocab.div_ceil(small_k::LOCAL_CHUNK as usize);
        let stride = small_top_k_limit(vocab);
        let u32s = |shape: &[usize]| DeviceTensor::empty(client, shape, DType::U32);
        Ok(Self {
            keys: u32s(&[rows, vocab]),
            partial_min: u32s(&[rows, cubes]),
            hist: u32s(&[rows, HIST_WORDS as usize]),
            records: u32s(&[rows, (STAGES + 1) as usize, REC as usize]),
            partials: u32s(&[rows, cubes, 3]),
            cand_keys: u32s(&[rows, small_k::SLOTS as usize]),
            cand_ids: u32s(&[rows, small_k::SLOTS as usize]),
            bounds: u32s(&[rows, chunks]),
            rows,
            vocab,
            cubes,
            chunks,
            stride,
        })
    }

    /// Device bytes held.
    pub fn bytes(&self) -> usize {
        [
            &self.keys,
            &self.partial_min,
            &self.hist,
            &self.records,
            &self.partials,
            &self.cand_keys,
            &self.cand_ids,
            &self.bounds,
        ]
        .iter()
        .map(|t| t.numel() * 4)
        .sum()
    }
}

/// `A`, the high limb's fraction bits: as many as keep a whole row's mass below 2^31 units.
fn scale_bits(vocab: usize) -> u32 {
    let log2 = usize::BITS - (vocab.max(1) - 1).leading_zeros();
    31u32.saturating_sub(log2).min(21)
}

fn check_atomics<R: Runtime>(client: &ComputeClient<R>, op: &'static str) -> Result<()> {
    let ty = Type::atomic(u32::elem_type_native());
    let usage = client.properties().atomic_type_usage(ty);
    let needed = [AtomicUsage::LoadStore, AtomicUsage::Add];
    if needed.iter().all(|&n| usage.contains(n)) {
        Ok(())
    } else {
        Err(OpsError::UnsupportedFeature {
            op,
            runtime: caps::runtime_name(client),
            feature: "u32 atomic load, store and add".into(),
        })
    }
}

/// Samples one token per row of `logits [rows, V]` (f32, f16 or bf16) as u32 `[rows]`,
/// allocating the workspace; see the module docs for the rules.
pub fn sample<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    inputs: &SamplingInputs<R>,
) -> Result<DeviceTensor<R>> {
    let workspace = SamplingWorkspace::new(client, inputs.rows(), inputs.vocab())?;
    let out = DeviceTensor::empty(client, &[inputs.rows()], DType::U32);
    sample_into(client, logits, inputs, &workspace, &out)?;
    Ok(out)
}

/// [`sample`] into a preallocated u32 tensor of one element per row, with a preallocated
/// workspace: allocation-free, so it can be captured in a CUDA graph.
pub fn sample_into<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    inputs: &SamplingInputs<R>,
    workspace: &SamplingWorkspace<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    sample_marking_into(client, logits, None, inputs, workspace, out)
}

/// [`presence_mark_into`] of `tokens` then [`sample_into`], in the launches of the draw alone:
/// the first kernel of the draw marks each row's token before it applies the penalty. Same
/// tokens and the same mask as the two calls.
pub fn mark_and_sample_into<R: Runtime>(
    client: &ComputeClient<R>,
    tokens: &DeviceTensor<R>,
    logits: &DeviceTensor<R>,
    inputs: &SamplingInputs<R>,
    workspace: &SamplingWorkspace<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    check_u32_ids("sample", "tokens", tokens, inputs.rows)?;
    sample_marking_into(client, logits, Some(tokens), inputs, workspace, out)
}

fn sample_marking_into<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    mark: Option<&DeviceTensor<R>>,
    inputs: &SamplingInputs<R>,
    workspace: &SamplingWorkspace<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "sample";
    validate_rows(client, OP, logits, &[])?;
    check_atomics(client, OP)?;
    let (rows, vocab) = (logits.rows(), logits.last_dim());
    for (what, r, v) in [
        ("inputs", inputs.rows, inputs.vocab),
        ("a workspace", workspace.rows, workspace.vocab),
    ] {
        if (rows, vocab) != (r, v) {
            return Err(OpsError::shape(
                OP,
                format!(
                    "logits {:?} do not match {what} for {r} rows of {v}",
                    logits.shape()
                ),
            ));
        }
    }
    check_u32_ids(OP, "out", out, rows)?;
    let scale = (1u64 << scale_bits(vocab)) as f32;
    if inputs.plan.small_k {
        launch_small_k(client, logits, mark, inputs, workspace, out, scale);
        return Ok(());
    }
    let cubes = workspace.cubes;
    let grid = CubeCount::Static(cubes as u32, rows as u32, 1);
    let dim = CubeDim::new_1d(CUBE);
    let ws = workspace;
    let plan = inputs.plan;
    let passes = plan.passes(logits.dtype());
    let stages = plan.stages(passes);
    // SAFETY: every buffer was checked (or allocated) above for the sizes the kernels index:
    // logits and keys `[rows, vocab]`, params `[rows, 4]`, presence `[rows, ceil(vocab / 32)]`,
    // partial minima `[rows, cubes]`, histograms `[rows, HIST_WORDS]`, records
    // `[rows, STAGES + 1, REC]`, partials `[rows, cubes, 3]`, uniforms, out and the marked
    // tokens `[rows]`.
    unsafe {
        kernels::prepare_kernel::launch_unchecked::<R>(
            client,
            grid.clone(),
            dim,
            logits.as_buffer_arg(),
            inputs.params.as_buffer_arg(),
            // Bound to the parameters when nothing is marked (never read then).
            mark.unwrap_or(&inputs.params).as_buffer_arg(),
            inputs.presence.as_buffer_arg(),
            ws.keys.as_buffer_arg(),
            ws.partial_min.as_buffer_arg(),
            ws.hist.as_buffer_arg(),
            vocab,
            mask_words(vocab),
            cubes,
            mark.is_some(),
            logits.dtype().elem_type(),
        );
        for (stage, &kind) in stages.iter().enumerate() {
            let prev = if stage == 0 {
                NO_STAGE
            } else {
                stages[stage - 1]
            };
            kernels::stage_kernel::launch_unchecked::<R>(
                client,
                grid.clone(),
                dim,
                ws.keys.as_buffer_arg(),
                inputs.params.as_buffer_arg(),
                ws.partial_min.as_buffer_arg(),
                ws.hist.as_buffer_arg(),
                ws.records.as_buffer_arg(),
                ws.partials.as_buffer_arg(),
                vocab,
                cubes,
                stage as u32,
                kind,
                prev,
                plan.mode_bits(),
                passes,
                scale,
            );
        }
        kernels::draw_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, rows as u32, 1),
            dim,
            ws.keys.as_buffer_arg(),
            inputs.params.as_buffer_arg(),
            inputs.uniform.as_buffer_arg(),
            ws.records.as_buffer_arg(),
            ws.partials.as_buffer_arg(),
            out.as_buffer_arg(),
            vocab,
            cubes,
            (stages.len() - 1) as u32,
            scale,
        );
    }
    Ok(())
}

/// The small-top-k plan's two launches (see [`SamplingPlan`]), on buffers [`sample_marking_into`]
/// checked.
fn launch_small_k<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    mark: Option<&DeviceTensor<R>>,
    inputs: &SamplingInputs<R>,
    ws: &SamplingWorkspace<R>,
    out: &DeviceTensor<R>,
    scale: f32,
) {
    let (rows, vocab) = (ws.rows, ws.vocab);
    let dim = CubeDim::new_1d(CUBE);
    // Scans and minima through plane operations where planes are 32 units wide (CUDA).
    let planes = caps::has_planes_of(client, small_k::PLANE);
    // SAFETY: the caller checked logits `[rows, vocab]`, out and the marked tokens `[rows]`
    // against the inputs (params `[rows, 4]`, presence `[rows, ceil(vocab / 32)]`, uniforms
    // `[rows]`) and the workspace (candidates `[rows, SLOTS]`, bounds `[rows, chunks]`); the
    // kernels write at most `stride` candidates per chunk and `chunks * stride <= SLOTS`.
    unsafe {
        small_k::local_top_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(ws.chunks as u32, rows as u32, 1),
            dim,
            logits.as_buffer_arg(),
            inputs.params.as_buffer_arg(),
            // Bound to the parameters when nothing is marked (never read then).
            mark.unwrap_or(&inputs.params).as_buffer_arg(),
            inputs.presence.as_buffer_arg(),
            ws.cand_keys.as_buffer_arg(),
            ws.cand_ids.as_buffer_arg(),
            ws.bounds.as_buffer_arg(),
            vocab,
            mask_words(vocab),
            ws.chunks,
            ws.stride,
            mark.is_some(),
            planes,
            logits.dtype().elem_type(),
        );
        small_k::final_draw_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, rows as u32, 1),
            dim,
            ws.cand_keys.as_buffer_arg(),
            ws.cand_ids.as_buffer_arg(),
            ws.bounds.as_buffer_arg(),
            inputs.params.as_buffer_arg(),
            inputs.uniform.as_buffer_arg(),
            out.as_buffer_arg(),
            ws.chunks,
            ws.stride,
            scale,
            planes,
        );
    }
}

/// Adds each row's token of `tokens` (u32 `[rows]`, e.g. the step's input token) to that row's
/// presence mask, on the device (ids outside the vocabulary are ignored).
pub fn presence_mark_into<R: Runtime>(
    client: &ComputeClient<R>,
    tokens: &DeviceTensor<R>,
    inputs: &SamplingInputs<R>,
) -> Result<()> {
    check_u32_ids("presence_mark", "tokens", tokens, inputs.rows)?;
    let units = (inputs.rows as u32).next_power_of_two().clamp(32, 256);
    // SAFETY: tokens holds `rows` u32 and presence `[rows, words]`; the kernel checks the row.
    unsafe {
        kernels::presence_mark_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static((inputs.rows as u32).div_ceil(units), 1, 1),
            CubeDim::new_1d(units),
            tokens.as_buffer_arg(),
            inputs.presence.as_buffer_arg(),
            inputs.rows,
            inputs.vocab,
            mask_words(inputs.vocab),
        );
    }
    Ok(())
}
