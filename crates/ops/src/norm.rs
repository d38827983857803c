//! RMSNorm, alone and fused with the pre-norm residual add.
//!
//! One cube per row: the cube sums the squares in f32 (plane or shared-memory reduction, see
//! [`crate::reduce`]), then scales. Numerics follow Hugging Face's `Qwen2RMSNorm`: statistics in
//! f32, `x * rsqrt(mean(x²) + eps)` rounded to the activation dtype, then multiplied by the weight.

use cubecl::prelude::*;

use crate::launch::{check_same_dtype, row_launch, validate_rows};
use crate::reduce::{cube_sum, ReducePlan};
use crate::{DeviceTensor, OpsError, Result};

/// `Σ v²` of one vector, in f32.
#[cube]
pub fn sum_squares<F: Float, N: Size>(v: Vector<F, N>) -> f32 {
    let mut s = 0f32;
    #[unroll]
    for i in 0..v.vector_size() {
        let e = f32::cast_from(v.extract(i));
        s += e * e;
    }
    s
}

/// `F(x * inv) * w`, rounding to the activation dtype before the weight as Hugging Face does.
#[cube]
pub fn scale_by_weight<F: Float, N: Size>(
    v: Vector<F, N>,
    w: Vector<F, N>,
    inv: f32,
) -> Vector<F, N> {
    let normed = Vector::<F, N>::cast_from(Vector::<f32, N>::cast_from(v) * Vector::new(inv));
    normed * w
}

/// `rsqrt(mean + eps)` of a row from each unit's partial sum of squares `partial` (`inv_len` =
/// 1 / the row's length), reduced over the whole cube with `plan` (every unit must call it).
#[cube]
pub fn cube_inv_rms(partial: f32, inv_len: f32, eps: f32, #[comptime] plan: ReducePlan) -> f32 {
    f32::inverse_sqrt(cube_sum(partial, plan) * inv_len + eps)
}

/// `rsqrt(mean(x[m]²) + eps)` of rows `0..m_rows` of `x` (rows of `k_vectors` vectors; `inv_k`
/// = 1 / K), reduced over the whole cube with `plan` (every unit must call it). The statistics of
/// an RMSNorm that a consuming kernel applies on the fly with [`scale_by_weight()`].
#[cube]
pub fn row_inv_rms<F: Float, N: Size>(
    x: &[Vector<F, N>],
    k_vectors: usize,
    inv_k: f32,
    eps: f32,
    #[comptime] m_rows: usize,
    #[comptime] plan: ReducePlan,
) -> Array<f32> {
    let mut inv = Array::<f32>::new(m_rows);
    #[unroll]
    for m in 0..m_rows {
        let mut s = 0f32;
        for i in range_stepped(UNIT_POS as usize, k_vectors, plan.cube_dim as usize) {
            s += sum_squares(x[m * k_vectors + i]);
        }
        inv[m] = cube_inv_rms(s, inv_k, eps, plan);
    }
    inv
}

/// What both kernels take at run time: the rows, their length in vectors, 1 / their length in
/// elements, and eps.
#[derive(CubeLaunch, CubeType)]
struct RowNorm {
    rows: usize,
    row_vectors: usize,
    inv_len: f32,
    eps: f32,
}

/// The second half of both kernels: from each unit's partial sum of squares of the cube's row
/// (which starts at vector `base` of `src`), `out = F(src * rsqrt(mean + eps)) * weight`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_normalized<F: Float, N: Size>(
    src: &[Vector<F, N>],
    weight: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    base: usize,
    partial: f32,
    norm: &RowNorm,
    #[comptime] plan: ReducePlan,
) {
    let inv = cube_inv_rms(partial, norm.inv_len, norm.eps, plan);
    for i in range_stepped(UNIT_POS as usize, norm.row_vectors, CUBE_DIM as usize) {
        out[base + i] = scale_by_weight(src[base + i], weight[i], inv);
    }
}

#[cube(launch_unchecked)]
fn rms_norm_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    weight: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    norm: RowNorm,
    #[comptime] plan: ReducePlan,
    #[define(F)] _dtype: ElemType,
) {
    // A grid folded into y (more rows than the x limit) has a few spare cubes.
    if CUBE_POS >= norm.rows {
        terminate!();
    }
    let base = CUBE_POS * norm.row_vectors;
    let mut acc = 0f32;
    for i in range_stepped(UNIT_POS as usize, norm.row_vectors, CUBE_DIM as usize) {
        acc += sum_squares(x[base + i]);
    }
    write_normalized(x, weight, out, base, acc, &norm, plan);
}

#[cube(launch_unchecked)]
fn rms_norm_residual_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    residual: &[Vector<F, N>],
    weight: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    sum_out: &mut [Vector<F, N>],
    norm: RowNorm,
    #[comptime] plan: ReducePlan,
    #[define(F)] _dtype: ElemType,
) {
    if CUBE_POS >= norm.rows {
        terminate!();
    }
    let base = CUBE_POS * norm.row_vectors;
    let mut acc = 0f32;
    for i in range_stepped(UNIT_POS as usize, norm.row_vectors, CUBE_DIM as usize) {
        // The sum is rounded to the activation dtype first, as the model's residual stream is.
        let s = x[base + i] + residual[base + i];
        sum_out[base + i] = s;
        acc += sum_squares(s);
    }
    write_normalized(&*sum_out, weight, out, base, acc, &norm, plan);
}

/// Errors unless `eps` is finite and `>= 0`.
pub fn check_eps(op: &'static str, eps: f32) -> Result<()> {
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(OpsError::invalid(
            op,
            format!("eps must be finite and >= 0, got {eps}"),
        ));
    }
    Ok(())
}

/// Errors unless `w` is a contiguous `[K]` of x's dtype (`K` = x's last dimension).
pub fn check_weight<R: Runtime>(
    op: &'static str,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
) -> Result<()> {
    check_same_dtype(op, x, w)?;
    if w.shape() != [x.last_dim()] || !w.is_contiguous() {
        return Err(OpsError::shape(
            op,
            format!("weight {:?} for rows of {}", w.shape(), x.last_dim()),
        ));
    }
    Ok(())
}

/// One validated launch of either kernel: a cube per row (see [`row_launch`]), the reduction
/// plan and the runtime arguments.
struct NormLaunch<R: Runtime> {
    count: CubeCount,
    dim: CubeDim,
    vector: usize,
    norm: RowNormLaunch<R>,
    plan: ReducePlan,
}

/// Validates `x` (with `same`, the tensors of its shape), the weight and eps, and plans the launch.
fn prepare<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    x: &DeviceTensor<R>,
    same: &[&DeviceTensor<R>],
    weight: &DeviceTensor<R>,
    eps: f32,
) -> Result<NormLaunch<R>> {
    validate_rows(client, op, x, same)?;
    check_weight(op, x, weight)?;
    check_eps(op, eps)?;
    let l = row_launch(client, x);
    Ok(NormLaunch {
        count: l.cube_count,
        dim: CubeDim::new_1d(l.cube_dim),
        vector: l.vector,
        norm: RowNormLaunch::new(x.rows(), l.row_vectors, 1.0 / x.last_dim() as f32, eps),
        plan: ReducePlan::new(client, l.cube_dim),
    })
}

/// `rms_norm(x, w, eps)` over the last dimension of `x` (any rank, contiguous).
pub fn rms_norm<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    eps: f32,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, x.shape(), x.dtype());
    rms_norm_into(client, x, weight, eps, &out)?;
    Ok(out)
}

/// [`rms_norm`] into a preallocated `out` of the same shape and dtype (no allocation).
pub fn rms_norm_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    eps: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "rms_norm";
    let l = prepare(client, OP, x, &[out], weight, eps)?;
    unsafe {
        rms_norm_kernel::launch_unchecked::<R>(
            client,
            l.count,
            l.dim,
            l.vector,
            x.as_buffer_arg(),
            weight.as_buffer_arg(),
            out.as_buffer_arg(),
            l.norm,
            l.plan,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}

/// The pre-norm residual pattern: returns `(rms_norm(x + residual, w, eps), x + residual)`.
pub fn rms_norm_residual<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    residual: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    eps: f32,
) -> Result<(DeviceTensor<R>, DeviceTensor<R>)> {
    let out = DeviceTensor::empty(client, x.shape(), x.dtype());
    let sum = DeviceTensor::empty(client, x.shape(), x.dtype());
    rms_norm_residual_into(client, x, residual, weight, eps, &out, &sum)?;
    Ok((out, sum))
}

/// [`rms_norm_residual`] into preallocated outputs. `sum_out` may not alias `x` or `residual`.
pub fn rms_norm_residual_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    residual: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    eps: f32,
    out: &DeviceTensor<R>,
    sum_out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "rms_norm_residual";
    let l = prepare(client, OP, x, &[residual, out, sum_out], weight, eps)?;
    unsafe {
        rms_norm_residual_kernel::launch_unchecked::<R>(
            client,
            l.count,
            l.dim,
            l.vector,
            x.as_buffer_arg(),
            residual.as_buffer_arg(),
            weight.as_buffer_arg(),
            out.as_buffer_arg(),
            sum_out.as_buffer_arg(),
            l.norm,
            l.plan,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}
