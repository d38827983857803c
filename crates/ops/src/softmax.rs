//! Softmax over the last dimension with online statistics: one pass computes the row's max and
//! its sum of exponentials together (`ops::online_softmax`), a second writes the result.

use cubecl::prelude::*;

use crate::launch::{row_launch, validate_rows};
use crate::online_softmax::{exp_shifted, rescale_factor};
use crate::reduce::{cube_max, cube_sum, ReducePlan};
use crate::{DeviceTensor, Result};

#[cube(launch_unchecked)]
fn softmax_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    rows: usize,
    row_vectors: usize,
    #[comptime] plan: ReducePlan,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let base = row * row_vectors;
    let mut m_unit = f32::new(f32::MIN);
    let mut s_unit = 0f32;
    for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
        let v = Vector::<f32, N>::cast_from(x[base + i]);
        // One rescale per vector: the vector's own max first, then its lanes.
        let mut vmax = m_unit;
        #[unroll]
        for k in 0..v.vector_size() {
            vmax = max(vmax, v.extract(k));
        }
        let mut add = 0f32;
        #[unroll]
        for k in 0..v.vector_size() {
            add += exp_shifted(v.extract(k), vmax);
        }
        s_unit = s_unit * rescale_factor(m_unit, vmax) + add;
        m_unit = vmax;
    }
    // Merge the units' statistics: the global max, then each sum rescaled to it.
    let m = cube_max(m_unit, plan);
    let total = cube_sum(s_unit * rescale_factor(m_unit, m), plan);
    let inv = Vector::<f32, N>::new(1f32 / total);
    let shift = Vector::<f32, N>::new(m);
    for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
        let v = Vector::<f32, N>::cast_from(x[base + i]);
        out[base + i] = Vector::<F, N>::cast_from(Vector::exp(v - shift) * inv);
    }
}

/// Softmax of each row of `x[.., n]` (f32 statistics).
pub fn softmax<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, x.shape(), x.dtype());
    softmax_into(client, x, &out)?;
    Ok(out)
}

/// [`softmax`] into a preallocated `out` (may be `x`).
pub fn softmax_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    validate_rows(client, "softmax", x, &[out])?;
    let l = row_launch(client, x);
    let plan = ReducePlan::new(client, l.cube_dim);
    unsafe {
        softmax_kernel::launch_unchecked::<R>(
            client,
            l.cube_count,
            CubeDim::new_1d(l.cube_dim),
            l.vector,
            x.as_buffer_arg(),
            out.as_buffer_arg(),
            x.rows(),
            l.row_vectors,
            plan,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}
