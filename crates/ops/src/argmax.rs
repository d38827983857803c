//! Argmax over the last dimension (greedy decoding reads one u32 per step instead of the
//! vocabulary's logits).

use cubecl::prelude::*;

use crate::launch::{check_u32_ids, cube_count_1d, validate_rows};
use crate::{caps, DType, DeviceTensor, Result};

/// Units per cube: one cube per row, a shared-memory tree over the units' candidates.
const CUBE: u32 = 512;
/// Loads each unit has in flight.
const UNROLL: usize = 8;

#[cube(launch_unchecked)]
fn argmax_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    out: &mut [u32],
    rows: usize,
    n_cols: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let row_vectors = n_cols / x[0].vector_size();
    let base = row * row_vectors;
    let mut best = f32::new(f32::MIN);
    let mut best_i = n_cols;
    // Each unit scans increasing indices, so a strict `>` keeps the first of equal values;
    // NaN compares false and is never chosen. The row is one SM's work (a vocabulary of 152k
    // logits is 300 KB in bf16), so the scan is latency-bound: each unit issues `UNROLL` wide
    // loads before comparing any (one dependent load per iteration took 14 µs on an H100).
    let stride = CUBE_DIM as usize;
    let last = row_vectors - 1;
    for i0 in range_stepped(UNIT_POS as usize, row_vectors, stride * UNROLL) {
        let mut batch = Array::<Vector<F, N>>::new(UNROLL);
        #[unroll]
        for u in 0..UNROLL {
            batch[u] = x[base + min(i0 + u * stride, last)];
        }
        #[unroll]
        for u in 0..UNROLL {
            let i = i0 + u * stride;
            if i < row_vectors {
                let v = batch[u];
                #[unroll]
                for k in 0..v.vector_size() {
                    let e = f32::cast_from(v.extract(k));
                    if e > best || (best_i == n_cols && e == best) {
                        best = e;
                        best_i = i * v.vector_size() + k;
                    }
                }
            }
        }
    }
    let mut vals = Shared::<[f32]>::new_slice(comptime![CUBE as usize]);
    let mut idxs = Shared::<[usize]>::new_slice(comptime![CUBE as usize]);
    vals[UNIT_POS as usize] = best;
    idxs[UNIT_POS as usize] = best_i;
    sync_cube();
    #[unroll]
    for step in 0..comptime![CUBE.trailing_zeros()] {
        let stride = comptime![(CUBE >> (step + 1)) as usize];
        let u = UNIT_POS as usize;
        if u < stride {
            let (v, i) = (vals[u + stride], idxs[u + stride]);
            let (bv, bi) = (vals[u], idxs[u]);
            // Larger value wins; on a tie (or an empty side) the smaller index.
            if v > bv || (v == bv && i < bi) || (bi == n_cols && i < n_cols) {
                vals[u] = v;
                idxs[u] = i;
            }
        }
        sync_cube();
    }
    if UNIT_POS == 0 {
        // A row of only NaN has no candidate: report index 0.
        let i = idxs[0];
        out[row] = select(i == n_cols, 0u32, i as u32);
    }
}

/// Index of the largest element of each row of `x[.., n]` as u32 `[..]` (the shape without the
/// last dim; a 1-D input gives `[1]`). First index on ties; NaN is never chosen (a row of only
/// NaN gives 0).
pub fn argmax<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
) -> Result<DeviceTensor<R>> {
    let mut shape = x.shape()[..x.rank().saturating_sub(1)].to_vec();
    if shape.is_empty() {
        shape.push(1);
    }
    let out = DeviceTensor::empty(client, &shape, DType::U32);
    argmax_into(client, x, &out)?;
    Ok(out)
}

/// [`argmax`] into a preallocated u32 tensor with one element per row.
pub fn argmax_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "argmax";
    validate_rows(client, OP, x, &[])?;
    check_u32_ids(OP, "out", out, x.rows())?;
    let vector = caps::vector_size_for(client, x.dtype(), x.last_dim());
    unsafe {
        argmax_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, x.rows() as u32),
            CubeDim::new_1d(CUBE),
            vector,
            x.as_buffer_arg(),
            out.as_buffer_arg(),
            x.rows(),
            x.last_dim(),
            x.dtype().elem_type(),
        );
    }
    Ok(())
}
