//! Softmax over the last dimension with online statistics: one pass computes the row's max and
//! its sum of exponentials together (`ops::online_softmax`), a second writes the result.

use cubecl::prelude::*;

use crate::launch::{cube_count_1d, validate_rows};
use crate::online_softmax::{exp_shifted, rescale_factor};
use crate::reduce::{cube_max, cube_sum, ReducePlan};
use crate::{DeviceTensor, Result};

#[cube(launch_unchecked)]
fn softmax_kernel<F: Float>(
    x: &[F],
    out: &mut [F],
    rows: usize,
    n: usize,
    #[comptime] plan: ReducePlan,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let base = row * n;
    let mut m_unit = f32::new(f32::MIN);
    let mut s_unit = 0f32;
    for i in range_stepped(UNIT_POS as usize, n, CUBE_DIM as usize) {
        let v = f32::cast_from(x[base + i]);
        let new_max = max(m_unit, v);
        s_unit = s_unit * rescale_factor(m_unit, new_max) + exp_shifted(v, new_max);
        m_unit = new_max;
    }
    // Merge the units' statistics: the global max, then each sum rescaled to it.
    let m = cube_max(m_unit, plan);
    let total = cube_sum(s_unit * rescale_factor(m_unit, m), plan);
    let inv = 1f32 / total;
    for i in range_stepped(UNIT_POS as usize, n, CUBE_DIM as usize) {
        out[base + i] = F::cast_from(f32::exp(f32::cast_from(x[base + i]) - m) * inv);
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
    let cube_dim = (x.last_dim() as u32).next_power_of_two().clamp(32, 256);
    let plan = ReducePlan::new(client, cube_dim);
    unsafe {
        softmax_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, x.rows() as u32),
            CubeDim::new_1d(cube_dim),
            x.as_buffer_arg(),
            out.as_buffer_arg(),
            x.rows(),
            x.last_dim(),
            plan,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}
