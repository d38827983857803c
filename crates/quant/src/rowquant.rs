//! Per-row (per-token) quantization of activations: `x[M, K] -> (q[M, K], scale[M])` with
//! `scale = max(max|row| / Qmax, SCALE_FLOOR)` and `q = encode(x / scale)` (see
//! [`crate::format`]).
//!
//! One cube per row: a cube-wide max (plane ops where the runtime has them, a shared-memory tree
//! otherwise), then each unit encodes four consecutive elements into one u32 word of the padded
//! output row (zeros past `K`). fp8 is encoded with integer operations ([`crate::codec`]) on
//! every runtime, so wgpu — which has no 8-bit storage and only a conversion polyfill for e4m3 —
//! produces the same bytes as CUDA. That was a choice over refusing fp8 on wgpu: the encoding is
//! a dozen integer operations per element in a memory-bound kernel, and it makes the fp8 path
//! testable on the CI machine.

use cubecl::prelude::*;
use ops::launch::{cube_count_1d, validate_rows};
use ops::norm::scale_by_weight;
use ops::reduce::{cube_max, ReducePlan};
use ops::{caps, DeviceTensor, OpsError, Result};

use crate::codec::{encode_e4m3, encode_int8};
use crate::format::{QuantFormat, SCALE_FLOOR};
use crate::layout::{check_byte_matrix, check_scales, empty_byte_matrix, words_arg};

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

#[cube(launch_unchecked)]
fn quantize_rows_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    q: &mut [u32],
    scales: &mut [f32],
    rows: usize,
    k: usize,
    pitch_words: usize,
    #[comptime] plan: RowQuantPlan,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row < rows {
        quantize_row::<F, N>(x, q, scales, row, k, pitch_words, plan);
    }
}

/// The scale of row `row` of `x` (`[.., k]` in vectors of `plan.vector`), returned to every
/// unit: a cube-wide max, so every unit of the cube must call it.
#[cube]
pub(crate) fn row_scale<F: Float, N: Size>(
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
    let amax = cube_max(amax, plan.reduce);
    let qmax = select(plan.fp8, 448.0f32, 127.0f32);
    max(amax / qmax, SCALE_FLOOR)
}

/// Word `w` of row `row`'s codes at scale `s`: elements `4w .. 4w + 4`, zero past `k`.
#[cube]
pub(crate) fn encode_word<F: Float, N: Size>(
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

#[cube]
fn quantize_row<F: Float, N: Size>(
    x: &[Vector<F, N>],
    q: &mut [u32],
    scales: &mut [f32],
    row: usize,
    k: usize,
    pitch_words: usize,
    #[comptime] plan: RowQuantPlan,
) {
    let s = row_scale::<F, N>(x, x, 1f32, row, k, plan);
    if UNIT_POS == 0 {
        scales[row] = s;
    }
    for w in range_stepped(UNIT_POS as usize, pitch_words, CUBE_DIM as usize) {
        q[row * pitch_words + w] = encode_word::<F, N>(x, x, 1f32, row, w, k, s, plan);
    }
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
    launch_rows(client, x, format, q, pitch, scales);
    Ok(())
}

/// Launches the kernel on validated operands.
pub(crate) fn launch_rows<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    format: QuantFormat,
    q: &DeviceTensor<R>,
    pitch: usize,
    scales: &DeviceTensor<R>,
) {
    let (rows, k) = (x.rows(), x.last_dim());
    let pitch_words = pitch / 4;
    let cube_dim = (pitch_words as u32).next_power_of_two().clamp(32, 256);
    let plan = RowQuantPlan::new(client, x, format, cube_dim);
    let vector = plan.vector;
    unsafe {
        quantize_rows_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, rows as u32),
            CubeDim::new_1d(cube_dim),
            vector,
            x.as_buffer_arg(),
            words_arg(q),
            scales.as_buffer_arg(),
            rows,
            k,
            pitch_words,
            plan,
            x.dtype().elem_type(),
        );
    }
}
