//! Per-row (per-token) quantization of activations: `x[M, K] -> (q[M, K], scale[M])` with
//! `scale = max(max|row| / Qmax, SCALE_FLOOR)` and `q = encode(x / scale)` (see
//! [`crate::format`]).
//!
//! One cube per row: a cube-wide max (plane ops where the runtime has them, a shared-memory tree
//! otherwise), then each unit encodes four consecutive elements into one u32 word of the padded
//! output row (zeros past `K`). At decode sizes (up to 16 rows) the cube has up to 1024 units,
//! each holding its words' elements in registers from one round of loads, and the 8-bit linear
//! layers have it apply their input RMSNorm first. fp8 is encoded with integer operations ([`crate::codec`]) on
//! every runtime, so wgpu — which has no 8-bit storage and only a conversion polyfill for e4m3 —
//! produces the same bytes as CUDA. That was a choice over refusing fp8 on wgpu: the encoding is
//! a dozen integer operations per element in a memory-bound kernel, and it makes the fp8 path
//! testable on the CI machine.

use cubecl::prelude::*;
use ops::launch::{cube_count_1d, validate_rows};
use ops::matmul::InputNorm;
use ops::norm::{scale_by_weight, sum_squares};
use ops::reduce::{cube_max, cube_sum, ReducePlan};
use ops::{caps, DeviceTensor, OpsError, Result};

use crate::codec::{encode_e4m3, encode_int8};
use crate::format::{QuantFormat, SCALE_FLOOR};
use crate::layout::{check_byte_matrix, check_scales, empty_byte_matrix, words_arg};

/// Most rows for which the pre-pass lets the next kernel launch as it starts (one cube per row,
/// so the two grids share the GPU without crowding it).
const DECODE_MAX_ROWS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RowQuantPlan {
    pub reduce: ReducePlan,
    pub fp8: bool,
    /// Elements per vector load of `x` (1, 2 or 4; divides K).
    pub vector: usize,
    /// The rows are quantized after an RMSNorm (`x̂ = F(F(x · inv) · g)`, as `ops::norm` rounds
    /// it): [`row_scale`] and [`encode_word`] read `norm_w` and the row's `inv`.
    pub norm: bool,
}

impl RowQuantPlan {
    /// The plan for rows of `x` quantized to `format` by a cube of `cube_dim` units.
    pub(crate) fn new<R: Runtime>(
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        format: QuantFormat,
        cube_dim: u32,
    ) -> Self {
        let k = x.last_dim();
        let vector = [4usize, 2, 1]
            .into_iter()
            .find(|&v| k.is_multiple_of(v) && caps::vector_size_for(client, x.dtype(), v) == v)
            .unwrap_or(1);
        Self {
            reduce: ReducePlan::new(client, cube_dim),
            fp8: format == QuantFormat::Fp8E4M3,
            vector,
            norm: false,
        }
    }
}

#[cube]
pub(crate) fn encode(v: f32, #[comptime] fp8: bool) -> u32 {
    if comptime![fp8] {
        encode_e4m3(v)
    } else {
        encode_int8(v)
    }
}

/// One cube per row. `held > 0` (decode sizes): the row is read once into registers
/// ([`quantize_row_held`], `held` words per unit); else it is read again for the norm's
/// statistics, the max and the codes.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn quantize_rows_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    norm_w: &[Vector<F, N>],
    q: &mut [u32],
    scales: &mut [f32],
    rows: usize,
    k: usize,
    pitch_words: usize,
    eps: f32,
    #[comptime] plan: RowQuantPlan,
    #[comptime] held: usize,
    #[comptime] trigger: bool,
    #[define(F)] _dtype: ElemType,
) {
    if comptime![trigger] {
        // The GEMM that reads these codes launches now and streams its weights while this
        // kernel waits for its input; it still waits for this one to complete before it reads
        // the codes.
        gpu_asm!("griddepcontrol.launch_dependents;");
        gpu_asm!("griddepcontrol.wait;");
    }
    let row = CUBE_POS;
    if row < rows {
        if comptime![held > 0] {
            let mut words = Array::<u32>::new(held);
            let s = quantize_row_held::<F, N>(x, norm_w, row, k, eps, &mut words, held, plan);
            if UNIT_POS == 0 {
                scales[row] = s;
            }
            #[unroll]
            for j in 0..held {
                let w = UNIT_POS as usize + j * CUBE_DIM as usize;
                if w < pitch_words {
                    q[row * pitch_words + w] = words[j];
                }
            }
        } else {
            let mut inv = 1f32;
            if comptime![plan.norm] {
                inv = row_inv_rms::<F, N>(x, row, k, eps, plan);
            }
            let s = row_scale::<F, N>(x, norm_w, inv, row, k, plan);
            if UNIT_POS == 0 {
                scales[row] = s;
            }
            for w in range_stepped(UNIT_POS as usize, pitch_words, CUBE_DIM as usize) {
                q[row * pitch_words + w] = encode_word::<F, N>(x, norm_w, inv, row, w, k, s, plan);
            }
        }
    }
}

/// `1 / rms(row)` of row `row` of `x` (`[.., k]` in vectors of `plan.vector`) with `eps`,
/// returned to every unit: a cube-wide sum, so every unit of the cube must call it.
#[cube]
fn row_inv_rms<F: Float, N: Size>(
    x: &[Vector<F, N>],
    row: usize,
    k: usize,
    eps: f32,
    #[comptime] plan: RowQuantPlan,
) -> f32 {
    let row_vectors = k / plan.vector;
    let mut ss = 0f32;
    for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
        ss += sum_squares(x[row * row_vectors + i]);
    }
    inv_rms_of(ss, k, eps, plan)
}

/// `1 / rms` of a row of `k` elements from each unit's partial sum of squares `ss` (a cube-wide
/// sum: every unit must call it).
#[cube]
fn inv_rms_of(ss: f32, k: usize, eps: f32, #[comptime] plan: RowQuantPlan) -> f32 {
    f32::inverse_sqrt(cube_sum(ss, plan.reduce) / k as f32 + eps)
}

/// The format's scale of a row from each unit's partial max `amax` of `|x|` (a cube-wide max:
/// every unit must call it).
#[cube]
fn scale_of(amax: f32, #[comptime] plan: RowQuantPlan) -> f32 {
    let amax = cube_max(amax, plan.reduce);
    let qmax = select(plan.fp8, 448.0f32, 127.0f32);
    max(amax / qmax, SCALE_FLOOR)
}

/// The scale of row `row` of `x` (`[.., k]` in vectors of `plan.vector`), returned to every
/// unit: a cube-wide max, so every unit of the cube must call it.
#[cube]
fn row_scale<F: Float, N: Size>(
    x: &[Vector<F, N>],
    norm_w: &[Vector<F, N>],
    inv: f32,
    row: usize,
    k: usize,
    #[comptime] plan: RowQuantPlan,
) -> f32 {
    let row_vectors = k / plan.vector;
    let base = row * row_vectors;
    let mut amax = 0f32;
    for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
        let mut v = x[base + i];
        if comptime![plan.norm] {
            v = scale_by_weight(v, norm_w[i], inv);
        }
        #[unroll]
        for l in 0..plan.vector {
            amax = max(amax, f32::abs(f32::cast_from(v.extract(l))));
        }
    }
    scale_of(amax, plan)
}

/// Row `row` of `x` (`[.., k]` in vectors of `plan.vector`) quantized with every unit of the cube
/// holding its share of the row in registers: unit `u` takes the code words (four elements each)
/// `u + j · CUBE_DIM` (`j < held`) and loads their elements (and the norm weight's) in one round
/// before the cube's reductions (the norm's sum of squares, the max), where reading the row
/// again for each would cost a memory round trip each, long when the memory system is busy
/// streaming a GEMM's weights. The arithmetic is that of [`row_scale`] and [`encode_word`].
/// Returns the row's scale to every unit (every unit must call it) and leaves word
/// `u + j · CUBE_DIM` in `words[j]` (zero past `k`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn quantize_row_held<F: Float, N: Size>(
    x: &[Vector<F, N>],
    norm_w: &[Vector<F, N>],
    row: usize,
    k: usize,
    eps: f32,
    words: &mut Array<u32>,
    #[comptime] held: usize,
    #[comptime] plan: RowQuantPlan,
) -> f32 {
    let per_word = comptime![4 / plan.vector];
    let count = comptime![held * 4 / plan.vector];
    let row_vectors = k / plan.vector;
    let mut xs = Array::<Vector<F, N>>::new(count);
    let mut ws = Array::<Vector<F, N>>::new(comptime![if plan.norm { count } else { 1 }]);
    #[unroll]
    for j in 0..held {
        #[unroll]
        for c in 0..per_word {
            let i = (UNIT_POS as usize + j * CUBE_DIM as usize) * per_word + c;
            let mut v = Vector::<F, N>::new(F::new(0.0));
            let mut w = Vector::<F, N>::new(F::new(0.0));
            if i < row_vectors {
                v = x[row * row_vectors + i];
                if comptime![plan.norm] {
                    w = norm_w[i];
                }
            }
            xs[j * per_word + c] = v;
            if comptime![plan.norm] {
                ws[j * per_word + c] = w;
            }
        }
    }
    if comptime![plan.norm] {
        let mut ss = 0f32;
        #[unroll]
        for e in 0..count {
            ss += sum_squares(xs[e]);
        }
        let inv = inv_rms_of(ss, k, eps, plan);
        #[unroll]
        for e in 0..count {
            xs[e] = scale_by_weight(xs[e], ws[e], inv);
        }
    }
    let mut amax = 0f32;
    #[unroll]
    for e in 0..count {
        let v = xs[e];
        #[unroll]
        for l in 0..plan.vector {
            amax = max(amax, f32::abs(f32::cast_from(v.extract(l))));
        }
    }
    let s = scale_of(amax, plan);
    #[unroll]
    for j in 0..held {
        let mut word = 0u32;
        #[unroll]
        for b in 0..4usize {
            let v = xs[j * per_word + comptime![b / plan.vector]];
            // Past K the held vector is zero, whose code is zero in both formats.
            let code = encode(
                f32::cast_from(v.extract(comptime![b % plan.vector])) / s,
                plan.fp8,
            );
            word |= code << comptime![(8 * b) as u32];
        }
        words[j] = word;
    }
    s
}

/// Word `w` of row `row`'s codes at scale `s`: elements `4w .. 4w + 4`, zero past `k`.
#[cube]
fn encode_word<F: Float, N: Size>(
    x: &[Vector<F, N>],
    norm_w: &[Vector<F, N>],
    inv: f32,
    row: usize,
    w: usize,
    k: usize,
    s: f32,
    #[comptime] plan: RowQuantPlan,
) -> u32 {
    let base = row * (k / plan.vector);
    let mut word = 0u32;
    #[unroll]
    for c in 0..comptime![4 / plan.vector] {
        let k0 = w * 4 + c * plan.vector;
        if k0 < k {
            let mut v = x[base + k0 / plan.vector];
            if comptime![plan.norm] {
                v = scale_by_weight(v, norm_w[k0 / plan.vector], inv);
            }
            #[unroll]
            for l in 0..plan.vector {
                let code = encode(f32::cast_from(v.extract(l)) / s, plan.fp8);
                word |= code << comptime![(8 * (c * plan.vector + l)) as u32];
            }
        }
    }
    word
}

/// Quantizes each row of `x` (float, contiguous, any rank; rows = all but the last dimension)
/// to `format`: returns `q` as a `[rows, K]` padded 8-bit matrix (see [`crate::layout`]) and the
/// f32 scales `[rows]`.
pub fn quantize_per_row<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    format: QuantFormat,
) -> Result<(DeviceTensor<R>, DeviceTensor<R>)> {
    validate_rows(client, "quantize_per_row", x, &[])?;
    let (rows, k) = (x.rows(), x.last_dim());
    let q = empty_byte_matrix(client, rows, k, format.dtype());
    let s = DeviceTensor::empty(client, &[rows], ops::DType::F32);
    quantize_per_row_into(client, x, format, &q, &s)?;
    Ok((q, s))
}

/// [`quantize_per_row`] into a preallocated `q` (`[rows, K]` padded 8-bit matrix of the
/// format's dtype) and `scales` (`[rows]` f32).
pub fn quantize_per_row_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    format: QuantFormat,
    q: &DeviceTensor<R>,
    scales: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "quantize_per_row";
    validate_rows(client, OP, x, &[])?;
    let (rows, k) = (x.rows(), x.last_dim());
    let pitch = check_byte_matrix(OP, "q", q, format.dtype())?;
    if q.shape() != [rows, k] {
        return Err(OpsError::shape(
            OP,
            format!("q is {:?}, expected [{rows}, {k}]", q.shape()),
        ));
    }
    check_scales(OP, "scales", scales, rows, false)?;
    launch_rows(client, x, None, format, q, pitch, scales);
    Ok(())
}

/// Launches the kernel on validated operands, with `norm` quantizing `rms_norm(x) · weight` (the
/// weight and eps validated by the caller). At decode sizes on a runtime with programmatic
/// dependent launch the next kernel launches as this one starts.
pub(crate) fn launch_rows<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    norm: Option<InputNorm<'_, R>>,
    format: QuantFormat,
    q: &DeviceTensor<R>,
    pitch: usize,
    scales: &DeviceTensor<R>,
) {
    let (rows, k) = (x.rows(), x.last_dim());
    let pitch_words = pitch / 4;
    // Decode sizes: up to 1024 units per row (as many as the runtime has), with rows short
    // enough for four words per unit.
    let most = client
        .properties()
        .hardware
        .max_units_per_cube
        .clamp(256, 1024);
    let decode = rows <= DECODE_MAX_ROWS && pitch_words <= 4 * most as usize;
    let cube_dim = (pitch_words as u32)
        .next_power_of_two()
        .clamp(32, if decode { most } else { 256 });
    let mut plan = RowQuantPlan::new(client, x, format, cube_dim);
    plan.norm = norm.is_some();
    let vector = plan.vector;
    let held = if decode {
        pitch_words.div_ceil(cube_dim as usize)
    } else {
        0
    };
    let trigger = decode && caps::has_pdl(client);
    // Without a norm its weight is never read: bind x.
    let (norm_w, eps) = norm.map_or((x, 0.0), |n| (n.weight, n.eps));
    unsafe {
        quantize_rows_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, rows as u32),
            CubeDim::new_1d(cube_dim),
            vector,
            x.as_buffer_arg(),
            norm_w.as_buffer_arg(),
            words_arg(q),
            scales.as_buffer_arg(),
            rows,
            k,
            pitch_words,
            eps,
            plan,
            held,
            trigger,
            x.dtype().elem_type(),
        );
    }
}
