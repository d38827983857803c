//! The add investigation's variants: the element-wise add of `ops::elementwise` under other
//! launch shapes (units per cube, vectors per unit, the 3-D index) and with its 16-byte loads
//! and stores issued as inline PTX carrying cache operators. The production kernel keeps the
//! shape these measured best (docs/investigations/add.md); these exist to re-run that
//! comparison.

use cubecl::prelude::*;
use ops::launch::{check_same_dtype, grid_units, unit_index, validate_rows, Grid};
use ops::{caps, DeviceTensor, OpsError, Result};

/// The add kernel of `ops::elementwise`, with the vectors per unit as a launch choice.
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

/// Launch shape of the add kernel: units per cube, 16-byte vectors per unit (strided by the
/// grid) and how its loads and stores are issued.
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

/// The shape `ops::elementwise::add_into` uses (cubes of 512 units, one vector each).
pub const ADD_LAUNCH: AddLaunch = AddLaunch {
    units: 512,
    per_unit: 1,
    hint: AddHint::Portable,
    flat_index: true,
};

/// `a + b` (as `ops::elementwise::add_into`) with an explicit launch shape and memory hints.
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
    let mut grid = Grid::new(client, len, units, launch.per_unit);
    grid.flat &= launch.flat_index;
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
    let mut grid = Grid::new(client, len, units, 1);
    grid.flat &= launch.flat_index;
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
