//! What the runtime behind a client can do, read once per launch from its properties.
//!
//! Two facts measured on this project's machines drive this module: Mesa's lavapipe (wgpu without
//! a GPU) has no bf16 (its WGSL compiler panics and the read returns garbage) and reports no plane
//! operations (and `plane_sum` silently returns wrong values there). Ops therefore check dtype
//! support before launching and pick a shared-memory reduction when plane ops are missing.

use std::sync::atomic::{AtomicBool, Ordering};

use cubecl::features::Plane;
use cubecl::prelude::*;

use crate::{DType, OpsError, Result};

/// The name of the runtime (`"cuda"`, `"wgpu"`, ...).
pub fn runtime_name<R: Runtime>(client: &ComputeClient<R>) -> &'static str {
    R::name(client)
}

/// Whether the runtime can load, store and compute with `dtype`.
pub fn supports_dtype<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    // wgpu advertises bf16 on some drivers yet cannot compile it (see module docs).
    if dtype == DType::BF16 && runtime_name(client).contains("wgpu") {
        return false;
    }
    client.properties().supports_type(dtype.elem_type())
}

/// Whether plane (warp/subgroup) reductions are reported and usable.
pub fn has_plane_ops<R: Runtime>(client: &ComputeClient<R>) -> bool {
    client.features().plane.contains(Plane::Ops)
}

/// Errors unless `dtype` is one of the float activations and the runtime supports it.
pub fn check_float_dtype<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    dtype: DType,
) -> Result<()> {
    if !dtype.is_float() {
        return Err(OpsError::UnsupportedDType {
            op,
            dtype,
            runtime: runtime_name(client),
            detail: "expected f32, f16 or bf16".into(),
        });
    }
    check_dtype_supported(client, op, dtype)
}

/// Errors if the runtime cannot handle `dtype` at all.
pub fn check_dtype_supported<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    dtype: DType,
) -> Result<()> {
    if supports_dtype(client, dtype) {
        return Ok(());
    }
    let detail = if dtype == DType::BF16 {
        "bf16 is not supported by this runtime; use f16 or f32".to_string()
    } else {
        format!("{dtype} is not supported by this runtime")
    };
    Err(OpsError::UnsupportedDType {
        op,
        dtype,
        runtime: runtime_name(client),
        detail,
    })
}

/// The widest vector (in elements) for loads of `dtype` that divides `len`: 16-byte loads
/// where the runtime allows them.
pub fn vector_size_for<R: Runtime>(client: &ComputeClient<R>, dtype: DType, len: usize) -> usize {
    client
        .io_optimized_vector_sizes(dtype.size())
        .find(|&v| len.is_multiple_of(v))
        .unwrap_or(1)
}

/// Plane size the runtime guarantees at least (32 on NVIDIA).
pub fn plane_size_min<R: Runtime>(client: &ComputeClient<R>) -> u32 {
    client.properties().hardware.plane_size_min.max(1)
}

/// Whether kernels may signal `griddepcontrol.launch_dependents` (CUDA on sm_90 and newer, where
/// the runtime launches kernels with programmatic dependent launch). The signal lets the next
/// kernel on the stream be scheduled while this one finishes; that kernel still waits for this
/// one's completion and memory before its first access, so results do not depend on it.
pub fn has_launch_dependents<R: Runtime>(client: &ComputeClient<R>) -> bool {
    // Both arrive with sm_90, which CubeCL reports through its cluster feature.
    has_clusters(client)
}

/// Whether kernels may be launched on thread-block clusters with the cluster barrier
/// (`barrier.cluster`; CUDA on sm_90 and newer).
pub fn has_clusters<R: Runtime>(client: &ComputeClient<R>) -> bool {
    runtime_name(client).contains("cuda") && client.properties().features.cube_cluster
}

/// Whether kernels are launched with programmatic dependent launch ([`has_launch_dependents`],
/// unless [`set_programmatic_launch`] turned it off, as the CLI's `--no-pdl` does together with
/// the runtime's own switch). Such a kernel may load what no kernel writes (a decode product's
/// weights) before its own `griddepcontrol.wait`, so that those loads overlap the end of the
/// kernel before it; the runtime then places no wait of its own at the top.
pub fn has_pdl<R: Runtime>(client: &ComputeClient<R>) -> bool {
    has_launch_dependents(client) && !PDL_OFF.load(Ordering::Relaxed)
}

static PDL_OFF: AtomicBool = AtomicBool::new(false);

/// Tells the kernels whether the runtime launches them with programmatic dependent launch (on by
/// default). Switch the runtime's launches the same way (`runtime::set_programmatic_launch`)
/// before the first kernel compiles; a mismatch stays correct but loses the early weight loads.
pub fn set_programmatic_launch(enabled: bool) {
    PDL_OFF.store(!enabled, Ordering::Relaxed);
}

/// Number of streaming multiprocessors (or a guess of 32 when the runtime does not say).
pub fn num_sms<R: Runtime>(client: &ComputeClient<R>) -> u32 {
    client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(32)
}

/// Whether the runtime has the register-level `mma` m16n8k16 of `dtype` (f16/bf16) with f32
/// accumulation on 32-lane planes (CUDA sm_80 and newer), the shape the tensor-core decode
/// kernels (attention, the skinny GEMV) are written for.
pub fn has_mma_m16n8k16<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    use cubecl::features::MmaConfig;
    use cubecl::ir::{ElemType, FloatKind};
    let kind = match dtype {
        DType::F16 => FloatKind::F16,
        DType::BF16 => FloatKind::BF16,
        _ => return false,
    };
    client.features().matmul.mma.contains(&MmaConfig {
        a_type: ElemType::Float(kind),
        b_type: ElemType::Float(kind),
        cd_type: ElemType::Float(FloatKind::F32),
        m: 16,
        n: 8,
        k: 16,
    }) && has_planes_of(client, 32)
}

/// Whether the runtime has plane operations on planes of exactly `width` units (no other
/// width chosen at run time).
pub fn has_planes_of<R: Runtime>(client: &ComputeClient<R>, width: u32) -> bool {
    has_plane_ops(client)
        && plane_size_min(client) == width
        && client.properties().hardware.plane_size_max == width
}
