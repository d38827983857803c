//! Element-wise ops: `add` (with row-vector broadcasting) and `swiglu` (on two tensors, or on the
//! two halves of one `[.., 2I]` gate-up product).
//!
//! Memory-bound: 16-byte vectors, a few per unit strided by the grid size (coalesced, several
//! loads in flight per unit), enough cubes to cover the tensor.

use cubecl::prelude::*;

use crate::launch::{check_same_dtype, validate_rows};
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

/// [`add_kernel`] (same shapes, no broadcasting) with its 16-byte loads and stores issued as
/// inline PTX, so that they can carry a cache operator: `.cs` ("cache streaming", evict first)
/// where `stream_loads` / `stream_stores` ask for it, the default `.ca` / `.wb` otherwise.
/// CUDA only, and only where a vector is 16 bytes; one vector per unit.
#[cube(launch_unchecked)]
fn add_ptx_kernel<F: Float, N: Size>(
    a: &[Vector<F, N>],
    b: &[Vector<F, N>],
    out: &mut [Vector<F, N>],
    len: usize,
    #[comptime] stream_loads: bool,
    #[comptime] stream_stores: bool,
    #[comptime] flat: bool,
    #[define(F)] _dtype: ElemType,
) {
    let i = unit_index(flat);
    if i < len {
        let off = u64::cast_from(i) * 16u64;
        let pa = unsafe { a.as_ptr_unchecked() };
        let pb = unsafe { b.as_ptr_unchecked() };
        let po = unsafe { out.as_mut_ptr_unchecked() };
        let x = load16::<F, N>(pa, off, stream_loads);
        let y = load16::<F, N>(pb, off, stream_loads);
        let sum = Vector::<F, N>::reinterpret(x) + Vector::<F, N>::reinterpret(y);
        let z = Vector::<u32, Const<4>>::reinterpret(sum);
        if comptime![stream_stores] {
            gpu_asm!(
                "{{ .reg .b64 t; add.s64 t, {p}, {o}; st.global.cs.v4.b32 [t], {v}; }}",
                p = in(_) po,
                o = in(_) off,
                v = in(_) z,
            );
        } else {
            gpu_asm!(
                "{{ .reg .b64 t; add.s64 t, {p}, {o}; st.global.v4.b32 [t], {v}; }}",
                p = in(_) po,
                o = in(_) off,
                v = in(_) z,
            );
        }
    }
}

/// The 16 bytes at `base + off` as inline PTX: `ld.global.cs` (streaming, evict first) or a plain
/// load. `gpu_asm!` takes a literal template, so each cache operator spells its own copy.
#[cube]
fn load16<F: Float, N: Size>(
    base: *const Vector<F, N>,
    off: u64,
    #[comptime] stream: bool,
) -> Vector<u32, Const<4>> {
    let r: Vector<u32, Const<4>>;
    if comptime![stream] {
        gpu_asm!(
            "{{ .reg .b64 t; add.s64 t, {p}, {o}; ld.global.cs.v4.b32 {r}, [t]; }}",
            p = in(_) base,
            o = in(_) off,
            r = out(_) r,
        );
    } else {
        gpu_asm!(
            "{{ .reg .b64 t; add.s64 t, {p}, {o}; ld.global.v4.b32 {r}, [t]; }}",
            p = in(_) base,
            o = in(_) off,
            r = out(_) r,
        );
    }
    r
}

/// This unit's index in the grid. With a 1-D cube count (`flat`, see [`Grid`]) it is the x axis
/// alone, which spares the 3-D arithmetic of `ABSOLUTE_POS` (about 0.07 µs of a 36 µs add on the
/// H100, BENCHMARKS.md); a cube count spilled to y (past the runtime's maximum along x) needs it.
#[cube]
fn unit_index(#[comptime] flat: bool) -> usize {
    if comptime![flat] {
        ABSOLUTE_POS_X as usize
    } else {
        ABSOLUTE_POS
    }
}

/// The number of units in the grid, counted the way [`unit_index`] counts.
#[cube]
fn grid_units(#[comptime] flat: bool) -> usize {
    if comptime![flat] {
        (CUBE_COUNT_X * CUBE_DIM_X) as usize
    } else {
        CUBE_COUNT * CUBE_DIM as usize
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
/// the H100 (4096 x 4096, BENCHMARKS.md) put one vector per unit in cubes of 512 ahead of the
/// strided shape above (f16 eager 37.1 vs 38.9 µs; 35.2 vs 35.7 µs replayed from a graph).
const ADD_CUBE: u32 = 512;
const ADD_PER_UNIT: usize = 1;

/// Launch shape of the add kernel: units per cube, 16-byte vectors per unit (strided by the
/// grid) and how its loads and stores are issued. For the benchmarks that sweep it; [`add_into`]
/// uses the measured default.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddLaunch {
    pub units: u32,
    pub per_unit: usize,
    pub hint: AddHint,
    /// Index by the x axis alone where the cube count allows (the default); `false` always
    /// takes CubeCL's 3-D `ABSOLUTE_POS` (the benchmark's control).
    pub flat_index: bool,
}

/// How the add kernel issues its memory operations.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddHint {
    /// The portable kernel (the default everywhere).
    Portable,
    /// Inline PTX (CUDA, 16-byte vectors, one per unit) with plain loads and stores: the
    /// control for the two below.
    Ptx,
    /// Inline PTX, `ld.global.cs` and `st.global.cs` (streaming, evict first).
    Stream,
    /// Inline PTX, plain loads and `st.global.cs`.
    StreamStores,
    /// Inline PTX, `ld.global.cs` and plain stores.
    StreamLoads,
}

#[doc(hidden)]
pub const ADD_LAUNCH: AddLaunch = AddLaunch {
    units: ADD_CUBE,
    per_unit: ADD_PER_UNIT,
    hint: AddHint::Portable,
    flat_index: true,
};

fn elementwise_grid<R: Runtime>(client: &ComputeClient<R>, vectors: usize) -> Grid {
    Grid::new(client, vectors, CUBE, PER_UNIT, true)
}

/// Launch geometry of an element-wise kernel: enough cubes of `units` to give each unit
/// `per_unit` vectors, and whether the kernel may index by the x axis alone (`flat`: the cube
/// count is 1-D and the grid's unit count fits the 32-bit x index).
struct Grid {
    count: CubeCount,
    dim: CubeDim,
    flat: bool,
}

impl Grid {
    fn new<R: Runtime>(
        client: &ComputeClient<R>,
        vectors: usize,
        units: u32,
        per_unit: usize,
        allow_flat: bool,
    ) -> Self {
        let cubes = vectors.div_ceil(units as usize * per_unit) as u32;
        let count = crate::launch::cube_count_1d(client, cubes);
        let one_d = matches!(count, CubeCount::Static(_, 1, 1));
        let fits = cubes as u64 * units as u64 <= u32::MAX as u64;
        Grid {
            count,
            dim: CubeDim::new_1d(units),
            flat: allow_flat && one_d && fits,
        }
    }
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
    add_into_with(client, a, b, out, ADD_LAUNCH)
}

/// [`add_into`] with an explicit launch shape (benchmark sweeps).
#[doc(hidden)]
pub fn add_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    launch: AddLaunch,
) -> Result<()> {
    const OP: &str = "add";
    if launch.units == 0 || launch.per_unit == 0 {
        return Err(OpsError::invalid(
            OP,
            format!("empty launch shape {launch:?}"),
        ));
    }
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
    let units = launch
        .units
        .min(client.properties().hardware.max_units_per_cube);
    if launch.hint != AddHint::Portable {
        return add_ptx(client, [a, b, out], broadcast, vector, len, units, launch);
    }
    let grid = Grid::new(client, len, units, launch.per_unit, launch.flat_index);
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
            launch.per_unit,
            grid.flat,
            a.dtype().elem_type(),
        );
    }
    Ok(())
}

/// The inline-PTX add ([`AddHint`] other than `Portable`): CUDA only, same shapes, 16-byte
/// vectors, one per unit; anything else is refused rather than run another way.
fn add_ptx<R: Runtime>(
    client: &ComputeClient<R>,
    [a, b, out]: [&DeviceTensor<R>; 3],
    broadcast: bool,
    vector: usize,
    len: usize,
    units: u32,
    launch: AddLaunch,
) -> Result<()> {
    const OP: &str = "add";
    let hint = launch.hint;
    if !caps::runtime_name(client).contains("cuda") {
        return Err(OpsError::UnsupportedFeature {
            op: OP,
            runtime: caps::runtime_name(client),
            feature: format!("inline PTX ({hint:?})"),
        });
    }
    if broadcast || vector * a.dtype().size() != 16 || launch.per_unit != 1 {
        return Err(OpsError::invalid(
            OP,
            format!("{hint:?} needs same-shape operands in 16-byte vectors, one per unit"),
        ));
    }
    let grid = Grid::new(client, len, units, 1, launch.flat_index);
    let stream_loads = matches!(hint, AddHint::Stream | AddHint::StreamLoads);
    let stream_stores = matches!(hint, AddHint::Stream | AddHint::StreamStores);
    unsafe {
        add_ptx_kernel::launch_unchecked::<R>(
            client,
            grid.count,
            grid.dim,
            vector,
            a.as_buffer_arg(),
            b.as_buffer_arg(),
            out.as_buffer_arg(),
            len,
            stream_loads,
            stream_stores,
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
