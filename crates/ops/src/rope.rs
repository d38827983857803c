//! Rotary position embeddings in the non-interleaved "rotate half" layout of Qwen2, Qwen3 and
//! Llama, their tables (default frequencies or Llama 3's scaled bands, [`RopeScaling`]), and the
//! fused RMSNorm + RoPE op.
//!
//! For a head vector `x` of dim `D` and `i < D/2`, with `c = cos(p f_i)`, `s = sin(p f_i)` and
//! the inverse frequency `f_i` (`θ^(-2i/D)` by default):
//! `out[i] = x[i] c - x[i + D/2] s`, `out[i + D/2] = x[i + D/2] c + x[i] s` (math in f32).

use cubecl::prelude::*;

use crate::launch::{check_same_dtype, cube_count_1d, validate_rows};
use crate::norm::{cube_inv_rms, scale_by_weight, sum_squares};
use crate::reduce::ReducePlan;
use crate::{caps, DType, DeviceTensor, OpsError, Result};

/// How the rotary inverse frequencies derive from `theta` (transformers' `rope_type`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// `inv_freq[i] = theta^(-2i/D)` (`rope_type: "default"`).
    None,
    /// Llama 3.1's frequency bands (`rope_type: "llama3"`): with `wavelen = 2π / inv_freq` and
    /// the original context `L`, wavelengths below `L / high_freq_factor` keep their frequency,
    /// those above `L / low_freq_factor` are divided by `factor`, and the band between blends
    /// the two with `s = (L / wavelen - low) / (high - low)`:
    /// `(1 - s) · inv_freq / factor + s · inv_freq`.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// Errors unless the parameters give finite, positive frequencies.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "RopeScaling";
        match *self {
            Self::None => Ok(()),
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let positive = |v: f64| v.is_finite() && v > 0.0;
                if !(positive(factor) && positive(low_freq_factor) && positive(high_freq_factor)) {
                    return Err(OpsError::invalid(
                        OP,
                        format!(
                            "llama3 factors must be finite and > 0, got factor {factor}, \
                             low_freq_factor {low_freq_factor}, high_freq_factor {high_freq_factor}"
                        ),
                    ));
                }
                if high_freq_factor <= low_freq_factor {
                    return Err(OpsError::invalid(
                        OP,
                        format!(
                            "llama3 high_freq_factor {high_freq_factor} must exceed \
                             low_freq_factor {low_freq_factor}"
                        ),
                    ));
                }
                if original_max_position_embeddings == 0 {
                    return Err(OpsError::invalid(
                        OP,
                        "llama3 original_max_position_embeddings must be > 0",
                    ));
                }
                Ok(())
            }
        }
    }

    /// The `D / 2` inverse frequencies, in f64: transformers' `_compute_default_rope_parameters`
    /// and `_compute_llama3_parameters` step by step (it computes them in f32).
    pub fn inv_freq(&self, head_dim: usize, theta: f64) -> Vec<f64> {
        let base = crate::reference::rope::default_inv_freq(head_dim, theta);
        match *self {
            Self::None => base,
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old_context = original_max_position_embeddings as f64;
                let low_freq_wavelen = old_context / low_freq_factor;
                let high_freq_wavelen = old_context / high_freq_factor;
                base.into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        let scaled = if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            f
                        };
                        let smooth = (old_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // Frequencies are finite (validated), so the negated comparisons of
                        // transformers' masks are these.
                        let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                        if medium {
                            smoothed
                        } else {
                            scaled
                        }
                    })
                    .collect()
            }
        }
    }
}

/// cos/sin tables for every position below `max_positions`, computed once per model.
pub struct RopeCache<R: Runtime> {
    /// f32 `[max_positions, head_dim / 2]`.
    pub cos: DeviceTensor<R>,
    /// f32 `[max_positions, head_dim / 2]`.
    pub sin: DeviceTensor<R>,
    pub head_dim: usize,
    /// The `head_dim / 2` inverse frequencies the tables were made from.
    pub inv_freq: Vec<f64>,
}

impl<R: Runtime> Clone for RopeCache<R> {
    fn clone(&self) -> Self {
        Self {
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            head_dim: self.head_dim,
            inv_freq: self.inv_freq.clone(),
        }
    }
}

impl<R: Runtime> RopeCache<R> {
    /// Tables of the default rotary embedding (inverse frequencies `θ^(-2i/D)` as Hugging
    /// Face's Qwen2 and Llama define them), computed on the host in f64 and stored as f32.
    pub fn new(
        client: &ComputeClient<R>,
        max_positions: usize,
        head_dim: usize,
        theta: f64,
    ) -> Result<Self> {
        Self::with_scaling(client, max_positions, head_dim, theta, RopeScaling::None)
    }

    /// Tables of `theta` with a frequency scaling ([`RopeScaling::inv_freq`]).
    pub fn with_scaling(
        client: &ComputeClient<R>,
        max_positions: usize,
        head_dim: usize,
        theta: f64,
        scaling: RopeScaling,
    ) -> Result<Self> {
        const OP: &str = "RopeCache::new";
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(OpsError::invalid(
                OP,
                format!("head_dim must be even and > 0, got {head_dim}"),
            ));
        }
        if !(theta.is_finite() && theta > 0.0) {
            return Err(OpsError::invalid(
                OP,
                format!("theta must be finite and > 0, got {theta}"),
            ));
        }
        scaling.validate()?;
        Self::from_inv_freq(client, max_positions, &scaling.inv_freq(head_dim, theta))
    }

    /// Tables of explicit inverse frequencies (`head_dim = 2 * inv_freq.len()`): entry `[p, i]`
    /// is `cos(p * inv_freq[i])`, computed in f64 and stored as f32.
    pub fn from_inv_freq(
        client: &ComputeClient<R>,
        max_positions: usize,
        inv_freq: &[f64],
    ) -> Result<Self> {
        const OP: &str = "RopeCache::from_inv_freq";
        if inv_freq.is_empty() {
            return Err(OpsError::invalid(OP, "no inverse frequencies"));
        }
        if let Some(bad) = inv_freq.iter().find(|f| !f.is_finite()) {
            return Err(OpsError::invalid(
                OP,
                format!("inverse frequencies must be finite, got {bad}"),
            ));
        }
        if max_positions == 0 {
            return Err(OpsError::invalid(OP, "max_positions must be > 0"));
        }
        let (cos, sin) = tables_f32(max_positions, inv_freq);
        let shape = [max_positions, inv_freq.len()];
        Ok(Self {
            cos: DeviceTensor::from_slice(client, &cos, &shape)?,
            sin: DeviceTensor::from_slice(client, &sin, &shape)?,
            head_dim: 2 * inv_freq.len(),
            inv_freq: inv_freq.to_vec(),
        })
    }

    pub fn max_positions(&self) -> usize {
        self.cos.shape()[0]
    }
}

/// Positions between two exact `sin_cos` calls of [`tables_f32`].
const EXACT_EVERY: usize = 256;

/// The cos and sin tables `[rows, inv_freq.len()]` in f32, on every core. Each row block starts
/// from an exact f64 `sin_cos(p * f)` and steps by angle addition in f64 (a rotation by `f`),
/// whose drift over [`EXACT_EVERY`] steps (~1e-13) is far below f32's rounding: a few
/// multiply-adds per entry instead of two transcendental calls, which matters for long contexts
/// (10^8 positions took 80 s with `cos`/`sin` per entry and f64 tables on the host).
fn tables_f32(rows: usize, inv_freq: &[f64]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = vec![0f32; rows * half];
    let mut sin = vec![0f32; rows * half];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Whole blocks per thread, so that every block starts at a multiple of EXACT_EVERY.
    let rows_per_thread = rows.div_ceil(threads).div_ceil(EXACT_EVERY) * EXACT_EVERY;
    std::thread::scope(|scope| {
        for (t, (c, s)) in cos
            .chunks_mut(rows_per_thread * half)
            .zip(sin.chunks_mut(rows_per_thread * half))
            .enumerate()
        {
            scope.spawn(move || fill_rows(t * rows_per_thread, inv_freq, c, s));
        }
    });
    (cos, sin)
}

/// Rows `first_row..` of the tables (as many as `cos` holds), `first_row` a multiple of
/// [`EXACT_EVERY`].
fn fill_rows(first_row: usize, inv_freq: &[f64], cos: &mut [f32], sin: &mut [f32]) {
    let half = inv_freq.len();
    for (b, (cb, sb)) in cos
        .chunks_mut(EXACT_EVERY * half)
        .zip(sin.chunks_mut(EXACT_EVERY * half))
        .enumerate()
    {
        let p0 = (first_row + b * EXACT_EVERY) as f64;
        for (i, &f) in inv_freq.iter().enumerate() {
            let (step_s, step_c) = f.sin_cos();
            let (mut s, mut c) = (p0 * f).sin_cos();
            for r in 0..cb.len() / half {
                cb[r * half + i] = c as f32;
                sb[r * half + i] = s as f32;
                (c, s) = (c * step_c - s * step_s, s * step_c + c * step_s);
            }
        }
    }
}

/// Loads `N` consecutive f32 entries of a table into a vector.
#[cube]
fn table_vector<N: Size>(table: &[f32], start: usize) -> Vector<f32, N> {
    let mut v = Vector::<f32, N>::empty();
    #[unroll]
    for k in 0..v.vector_size() {
        v.insert(k, table[start + k]);
    }
    v
}

/// One unit per vector of `N` pairs `(x[i], x[i + D/2])`: 16-byte loads of x, and cos/sin rows
/// shared by the token's heads (so they stay in cache).
#[cube(launch_unchecked)]
fn rope_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    positions: &[u32],
    cos: &[f32],
    sin: &[f32],
    out: &mut [Vector<F, N>],
    items: usize,
    heads: usize,
    half_vectors: usize,
    table_rows: u32,
    #[define(F)] _dtype: ElemType,
) {
    let item = ABSOLUTE_POS;
    if item >= items {
        terminate!();
    }
    let j = item % half_vectors;
    let row = item / half_vectors;
    // Positions live on the device: past the table, the last row is used (documented).
    let p = min(positions[row / heads], table_rows - 1) as usize;
    let base = row * 2 * half_vectors;
    let a = Vector::<f32, N>::cast_from(x[base + j]);
    let b = Vector::<f32, N>::cast_from(x[base + half_vectors + j]);
    let t0 = (p * half_vectors + j) * a.vector_size();
    let c = table_vector::<N>(cos, t0);
    let s = table_vector::<N>(sin, t0);
    out[base + j] = Vector::<F, N>::cast_from(a * c - b * s);
    out[base + half_vectors + j] = Vector::<F, N>::cast_from(b * c + a * s);
}

/// RoPE of `x[T, H, D]` at `positions[T]` (u32, on the device).
pub fn rope<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    positions: &DeviceTensor<R>,
    cache: &RopeCache<R>,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, x.shape(), x.dtype());
    rope_into(client, x, positions, cache, &out)?;
    Ok(out)
}

/// [`rope`] into `out` (may be `x` itself: each pair is read before it is written).
///
/// Positions at or past `cache.max_positions()` use the table's last row: they live on the
/// device, so the kernel cannot report them. [`rope_host_positions`] checks them first.
pub fn rope_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    positions: &DeviceTensor<R>,
    cache: &RopeCache<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "rope";
    validate_rows(client, OP, x, &[out])?;
    if x.rank() != 3 || x.shape()[2] != cache.head_dim {
        return Err(OpsError::shape(
            OP,
            format!("x {:?} must be [T, H, {}]", x.shape(), cache.head_dim),
        ));
    }
    let (tokens, heads, head_dim) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    if positions.dtype() != DType::U32
        || positions.shape() != [tokens]
        || !positions.is_contiguous()
    {
        return Err(OpsError::shape(
            OP,
            format!(
                "positions must be u32 [{tokens}], got {:?} {}",
                positions.shape(),
                positions.dtype()
            ),
        ));
    }
    let half = head_dim / 2;
    let vector = caps::vector_size_for(client, x.dtype(), half);
    let half_vectors = half / vector;
    let items = tokens * heads * half_vectors;
    unsafe {
        rope_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, items.div_ceil(256) as u32),
            CubeDim::new_1d(256),
            vector,
            x.as_buffer_arg(),
            positions.as_buffer_arg(),
            cache.cos.as_buffer_arg(),
            cache.sin.as_buffer_arg(),
            out.as_buffer_arg(),
            items,
            heads,
            half_vectors,
            cache.max_positions() as u32,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}

/// [`rope`] with positions given on the host, checked against the cache before uploading.
pub fn rope_host_positions<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    positions: &[u32],
    cache: &RopeCache<R>,
) -> Result<DeviceTensor<R>> {
    if let Some(&p) = positions
        .iter()
        .find(|&&p| p as usize >= cache.max_positions())
    {
        return Err(OpsError::invalid(
            "rope",
            format!(
                "position {p} is past the cache's {} positions",
                cache.max_positions()
            ),
        ));
    }
    let pos = DeviceTensor::from_slice(client, positions, &[positions.len()])?;
    rope(client, x, &pos, cache)
}

#[cube(launch_unchecked)]
fn fused_rmsnorm_rope_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    weight: &[Vector<F, N>],
    cos: &[Vector<F, N>],
    sin: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    rows: usize,
    seq: usize,
    row_vectors: usize,
    half_vectors: usize,
    inv_len: f32,
    eps: f32,
    #[comptime] plan: ReducePlan,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let base = row * row_vectors;
    let mut acc = 0f32;
    for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
        acc += sum_squares(x[base + i]);
    }
    let inv = cube_inv_rms(acc, inv_len, eps, plan);
    // Row r of the [b, s] grid sits at sequence position r % s; tables are [s, head_dim].
    let tbl = (row % seq) * 2 * half_vectors;
    for k in range_stepped(UNIT_POS as usize, row_vectors / 2, CUBE_DIM as usize) {
        let head = k / half_vectors;
        let j = k % half_vectors;
        let ia = head * 2 * half_vectors + j;
        let ib = ia + half_vectors;
        let a = Vector::<f32, N>::cast_from(scale_by_weight(x[base + ia], weight[ia], inv));
        let b = Vector::<f32, N>::cast_from(scale_by_weight(x[base + ib], weight[ib], inv));
        // Hugging Face's full-width tables: out = x * cos + rotate_half(x) * sin.
        let ca = Vector::<f32, N>::cast_from(cos[tbl + j]);
        let sa = Vector::<f32, N>::cast_from(sin[tbl + j]);
        let cb = Vector::<f32, N>::cast_from(cos[tbl + half_vectors + j]);
        let sb = Vector::<f32, N>::cast_from(sin[tbl + half_vectors + j]);
        out[base + ia] = Vector::<F, N>::cast_from(a * ca - b * sa);
        out[base + ib] = Vector::<F, N>::cast_from(b * cb + a * sb);
    }
}

/// RMSNorm over the hidden dim followed by RoPE on each head, in one kernel.
///
/// `x[b, s, h]`, `weight[h]`, `cos`/`sin` of shape `[s, head_dim]` or `[1, s, 1, head_dim]`
/// (Hugging Face's full-width tables, in x's dtype), `head_dim` even; `num_heads` is inferred as
/// `h / head_dim` when `None` and must agree with it otherwise.
pub fn fused_rmsnorm_rope<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    cos: &DeviceTensor<R>,
    sin: &DeviceTensor<R>,
    eps: f32,
    num_heads: Option<usize>,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, x.shape(), x.dtype());
    fused_rmsnorm_rope_into(client, x, weight, cos, sin, eps, num_heads, &out)?;
    Ok(out)
}

/// [`fused_rmsnorm_rope`] into a preallocated `out` of x's shape.
#[allow(clippy::too_many_arguments)]
pub fn fused_rmsnorm_rope_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    cos: &DeviceTensor<R>,
    sin: &DeviceTensor<R>,
    eps: f32,
    num_heads: Option<usize>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "fused_rmsnorm_rope";
    validate_rows(client, OP, x, &[out])?;
    if x.rank() != 3 {
        return Err(OpsError::shape(
            OP,
            format!("x {:?} must be [b, s, h]", x.shape()),
        ));
    }
    let (seq, hidden) = (x.shape()[1], x.shape()[2]);
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(OpsError::invalid(
            OP,
            format!("eps must be finite and >= 0, got {eps}"),
        ));
    }
    for t in [weight, cos, sin] {
        check_same_dtype(OP, x, t)?;
        if !t.is_contiguous() {
            return Err(OpsError::shape(
                OP,
                "weight, cos and sin must be contiguous",
            ));
        }
    }
    if weight.shape() != [hidden] {
        return Err(OpsError::shape(
            OP,
            format!("weight {:?}, expected [{hidden}]", weight.shape()),
        ));
    }
    let head_dim = match cos.shape() {
        [s, d] if *s == seq => *d,
        [1, s, 1, d] if *s == seq => *d,
        other => {
            return Err(OpsError::shape(
                OP,
                format!("cos {other:?} must be [{seq}, head_dim] or [1, {seq}, 1, head_dim]"),
            ))
        }
    };
    if sin.shape() != cos.shape() {
        return Err(OpsError::shape(
            OP,
            format!("sin {:?} differs from cos {:?}", sin.shape(), cos.shape()),
        ));
    }
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(OpsError::invalid(
            OP,
            format!("head_dim must be even and > 0, got {head_dim}"),
        ));
    }
    if !hidden.is_multiple_of(head_dim) {
        return Err(OpsError::shape(
            OP,
            format!("hidden {hidden} is not a multiple of head_dim {head_dim}"),
        ));
    }
    if let Some(n) = num_heads {
        if n * head_dim != hidden {
            return Err(OpsError::shape(
                OP,
                format!("num_heads {n} x head_dim {head_dim} != hidden {hidden}"),
            ));
        }
    }
    let vector = caps::vector_size_for(client, x.dtype(), head_dim / 2);
    let row_vectors = hidden / vector;
    let cube_dim = ((row_vectors / 2) as u32)
        .next_power_of_two()
        .clamp(32, 256);
    let plan = ReducePlan::new(client, cube_dim);
    unsafe {
        fused_rmsnorm_rope_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, x.rows() as u32),
            CubeDim::new_1d(cube_dim),
            vector,
            x.as_buffer_arg(),
            weight.as_buffer_arg(),
            cos.as_buffer_arg(),
            sin.as_buffer_arg(),
            out.as_buffer_arg(),
            x.rows(),
            seq,
            row_vectors,
            head_dim / 2 / vector,
            1.0 / hidden as f32,
            eps,
            plan,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}

/// The fused op as a module: holds the norm weight, the head size and eps.
pub struct FusedRmsNormRope<R: Runtime> {
    pub weight: DeviceTensor<R>,
    pub head_dim: usize,
    pub eps: f32,
}

impl<R: Runtime> FusedRmsNormRope<R> {
    /// Applies the op to `x[b, s, h]` with tables `cos`/`sin` (see [`fused_rmsnorm_rope`]);
    /// errors if the tables' head dim is not `self.head_dim`.
    pub fn forward(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        cos: &DeviceTensor<R>,
        sin: &DeviceTensor<R>,
    ) -> Result<DeviceTensor<R>> {
        if cos.shape().last() != Some(&self.head_dim) {
            return Err(OpsError::shape(
                "FusedRmsNormRope",
                format!(
                    "cos {:?} does not end in head_dim {}",
                    cos.shape(),
                    self.head_dim
                ),
            ));
        }
        let heads = x.last_dim() / self.head_dim.max(1);
        fused_rmsnorm_rope(client, x, &self.weight, cos, sin, self.eps, Some(heads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stepped tables equal `cos`/`sin` of `p * f` in f64, rounded to f32, to within an
    /// f32 rounding, at positions far into a long context and across block and thread edges.
    #[test]
    fn stepped_tables_match_direct_evaluation() {
        let inv_freq = crate::reference::rope::default_inv_freq(128, 1e6);
        let half = inv_freq.len();
        let check = |first: usize, cos: &[f32], sin: &[f32]| {
            let mut worst = 0f64;
            for r in (0..cos.len() / half)
                .step_by(37)
                .chain([cos.len() / half - 1])
            {
                let p = (first + r) as f64;
                for (i, &f) in inv_freq.iter().enumerate() {
                    let (s, c) = (p * f).sin_cos();
                    worst = worst
                        .max((cos[r * half + i] as f64 - c).abs())
                        .max((sin[r * half + i] as f64 - s).abs());
                }
            }
            assert!(worst < 2e-7, "from row {first}: worst difference {worst:e}");
        };
        let rows = 3 * EXACT_EVERY * 7 + 5;
        let (cos, sin) = tables_f32(rows, &inv_freq);
        check(0, &cos, &sin);
        // Rows of a 10^8-position context.
        let (mut cos, mut sin) = (vec![0f32; 1000 * half], vec![0f32; 1000 * half]);
        fill_rows(100_000_000, &inv_freq, &mut cos, &mut sin);
        check(100_000_000, &cos, &sin);
    }
}
