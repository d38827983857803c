//! Element-wise ops: `add` (with row-vector broadcasting) and `swiglu` (on two tensors, or on the
//! two halves of one `[.., 2I]` gate-up product).
//!
//! Memory-bound: 16-byte vectors, a few per unit strided by the grid size (coalesced, several
//! loads in flight per unit), enough cubes to cover the tensor.

use cubecl::prelude::*;

use crate::launch::{check_same_dtype, grid_units, unit_index, validate_rows, Grid};
use crate::{caps, DeviceTensor, OpsError, Result};

#[cube(launch_unchecked)]
fn add_kernel<F: Float, N: Size>(
    a: &[Vector<F, N>],
    b: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    len: usize,
    b_len: usize,
    #[comptime] broadcast: bool,
    #[comptime] per_unit: usize,
    #[comptime] flat: bool,
    #[define(F)] _dtype: ElemType,
) {
    let stride = grid_units(flat);
    // The modulo (a row vector repeated over the rows) costs a division per element: only the
    // broadcasting variant pays it.
    #[unroll]
    for k in 0..per_unit {
        let i = unit_index(flat) + k * stride;
        if i < len {
            if comptime![broadcast] {
                out[i] = a[i] + b[i % b_len];
            } else {
                out[i] = a[i] + b[i];
            }
        }
    }
}

/// `silu(g) * u`, computed in f32.
#[cube]
fn silu_times<F: Float, N: Size>(g: Vector<F, N>, u: Vector<F, N>) -> Vector<F, N> {
    let g = Vector::<f32, N>::cast_from(g);
    let u = Vector::<f32, N>::cast_from(u);
    let silu = g / (Vector::new(1f32) + Vector::exp(-g));
    Vector::<F, N>::cast_from(silu * u)
}

#[cube(launch_unchecked)]
fn swiglu_kernel<F: Float, N: Size>(
    gate: &[Vector<F, N>],
    up: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    len: usize,
    #[comptime] flat: bool,
    #[define(F)] _dtype: ElemType,
) {
    let stride = grid_units(flat);
    #[unroll]
    for k in 0..PER_UNIT {
        let i = unit_index(flat) + k * stride;
        if i < len {
            out[i] = silu_times::<F, N>(gate[i], up[i]);
        }
    }
}

/// `swiglu` on the halves of `gate_up[.., 2 * half]` (gate columns first): the output of a fused
/// gate-up projection that is not the fused MLP kernel (sparse or quantized weights).
#[cube(launch_unchecked)]
fn swiglu_concat_kernel<F: Float, N: Size>(
    gate_up: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    len: usize,
    half: usize,
    #[comptime] flat: bool,
    #[define(F)] _dtype: ElemType,
) {
    let stride = grid_units(flat);
    #[unroll]
    for k in 0..PER_UNIT {
        let i = unit_index(flat) + k * stride;
        if i < len {
            let row = i / half;
            let g_at = i + row * half;
            out[i] = silu_times::<F, N>(gate_up[g_at], gate_up[g_at + half]);
        }
    }
}

/// Units per cube for the element-wise kernels.
const CUBE: u32 = 256;
/// Vectors per unit (strided by the grid size, so each load instruction stays coalesced): more
/// bytes in flight per unit than one 16-byte load, which is what the copy bandwidth needs.
const PER_UNIT: usize = 4;

/// `add` reads two vectors and writes one per element and does almost no arithmetic; a sweep on
/// the H100 (4096 x 4096) put one vector per unit in cubes of 512 ahead of the
/// strided shape above (f16 eager 37.1 vs 38.9 µs; 35.2 vs 35.7 µs replayed from a graph).
const ADD_CUBE: u32 = 512;
const ADD_PER_UNIT: usize = 1;

fn elementwise_grid<R: Runtime>(client: &ComputeClient<R>, vectors: usize) -> Grid {
    Grid::new(client, vectors, CUBE, PER_UNIT)
}

/// `a + b`: same shape, or `b` a row vector `[n]` broadcast over the rows of `a[.., n]`.
pub fn add<R: Runtime>(
    client: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, a.shape(), a.dtype());
    add_into(client, a, b, &out)?;
    Ok(out)
}

/// [`add`] into a preallocated `out` (may be `a` itself: each element is read before it is
/// written by the same unit).
pub fn add_into<R: Runtime>(
    client: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "add";
    validate_rows(client, OP, a, &[out])?;
    check_same_dtype(OP, a, b)?;
    if !b.is_contiguous() {
        return Err(OpsError::shape(OP, "b must be contiguous"));
    }
    let broadcast = b.shape() != a.shape();
    if broadcast && b.shape() != [a.last_dim()] {
        return Err(OpsError::shape(
            OP,
            format!(
                "b {:?} is neither {:?} nor a row [{}]",
                b.shape(),
                a.shape(),
                a.last_dim()
            ),
        ));
    }
    let b_len = b.numel();
    let vector = caps::vector_size_for(client, a.dtype(), b_len.min(a.numel()));
    let len = a.numel() / vector;
    let units = ADD_CUBE.min(client.properties().hardware.max_units_per_cube);
    let grid = Grid::new(client, len, units, ADD_PER_UNIT);
    unsafe {
        add_kernel::launch_unchecked::<R>(
            client,
            grid.count,
            grid.dim,
            vector,
            a.as_buffer_arg(),
            b.as_buffer_arg(),
            out.as_buffer_arg(),
            len,
            b_len / vector,
            broadcast,
            ADD_PER_UNIT,
            grid.flat,
            a.dtype().elem_type(),
        );
    }
    Ok(())
}

/// `silu(gate) * up` (silu in f32), the activation of Qwen2's MLP.
pub fn swiglu<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &DeviceTensor<R>,
    up: &DeviceTensor<R>,
) -> Result<DeviceTensor<R>> {
    let out = DeviceTensor::empty(client, gate.shape(), gate.dtype());
    swiglu_into(client, gate, up, &out)?;
    Ok(out)
}

/// [`swiglu`] into a preallocated `out`.
pub fn swiglu_into<R: Runtime>(
    client: &ComputeClient<R>,
    gate: &DeviceTensor<R>,
    up: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "swiglu";
    validate_rows(client, OP, gate, &[up, out])?;
    let vector = caps::vector_size_for(client, gate.dtype(), gate.numel());
    let len = gate.numel() / vector;
    let grid = elementwise_grid(client, len);
    unsafe {
        swiglu_kernel::launch_unchecked::<R>(
            client,
            grid.count,
            grid.dim,
            vector,
            gate.as_buffer_arg(),
            up.as_buffer_arg(),
            out.as_buffer_arg(),
            len,
            grid.flat,
            gate.dtype().elem_type(),
        );
    }
    Ok(())
}

/// `silu(gate) * up` where `gate_up[.., 2I]` holds the gate columns then the up columns (the
/// layout of a fused gate-up projection); returns `[.., I]`.
pub fn swiglu_concat<R: Runtime>(
    client: &ComputeClient<R>,
    gate_up: &DeviceTensor<R>,
) -> Result<DeviceTensor<R>> {
    let mut shape = gate_up.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last /= 2;
    }
    let out = DeviceTensor::empty(client, &shape, gate_up.dtype());
    swiglu_concat_into(client, gate_up, &out)?;
    Ok(out)
}

/// [`swiglu_concat`] into a preallocated `out[.., I]`.
pub fn swiglu_concat_into<R: Runtime>(
    client: &ComputeClient<R>,
    gate_up: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "swiglu_concat";
    validate_rows(client, OP, gate_up, &[])?;
    let two_i = gate_up.last_dim();
    if !two_i.is_multiple_of(2) {
        return Err(OpsError::shape(
            OP,
            format!("the last dimension {two_i} of gate_up is not even"),
        ));
    }
    let mut want = gate_up.shape().to_vec();
    *want.last_mut().expect("rank >= 1") = two_i / 2;
    check_same_dtype(OP, gate_up, out)?;
    if out.shape() != want.as_slice() || !out.is_contiguous() {
        return Err(OpsError::shape(
            OP,
            format!(
                "out must be a contiguous {want:?} for gate_up {:?}, got {:?}",
                gate_up.shape(),
                out.shape()
            ),
        ));
    }
    let half = two_i / 2;
    let vector = caps::vector_size_for(client, gate_up.dtype(), half);
    let len = out.numel() / vector;
    let grid = elementwise_grid(client, len);
    unsafe {
        swiglu_concat_kernel::launch_unchecked::<R>(
            client,
            grid.count,
            grid.dim,
            vector,
            gate_up.as_buffer_arg(),
            out.as_buffer_arg(),
            len,
            half / vector,
            grid.flat,
            gate_up.dtype().elem_type(),
        );
    }
    Ok(())
}
