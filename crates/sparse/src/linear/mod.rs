//! Dense x block-sparse matmul: `y[M, N] = x[M, K] · Wᵀ (+ bias)` with `W[N, K]` in BSR.
//!
//! One cube owns an output tile of `tile_m` rows of `x` by one block-row of `W` (`b` output
//! features) and walks that block-row's stored blocks only: for each block it stages the matching
//! `tile_m x b` columns of `x` and the `b x b` weight block through shared memory and accumulates
//! in f32. Absent blocks cost nothing; an empty block-row writes the bias (or zeros).
//!
//! Staging is software-pipelined. Where the runtime has async copies (CUDA sm_80+) the tensor-core
//! kernel fills `stages` shared buffers with `cp.async` copies (default 3; one mbarrier each), so
//! the next stages are in flight while the warps multiply the current one; elsewhere, while the
//! cube multiplies the blocks in one shared buffer, each unit already holds the next stage's
//! global loads in registers and writes them into the other buffer afterwards: one barrier per
//! stage (a single-buffer variant, two barriers per stage, exists for small shared memories).
//! Either way the block columns of a stage are read one stage before its data. A
//! stage is `k_groups` x `group_blocks` blocks: with few rows of `x` (decode, M = 1..16) the warps
//! of a cube work on different blocks of the row at once and their partial tiles are summed at the
//! end, which keeps enough loads in flight to stream the weights. Launch-shape defaults come from
//! a sweep on the H100 (see `crates/sparse/BENCHMARKS.md`).
//!
//! Two inner products, picked at compile time:
//! - tensor cores (CubeCL `cmma`, 16x16x16 fragments, f32 accumulators) for f16/bf16 where the
//!   runtime reports that shape (CUDA);
//! - a vectorised f32 dot product per unit everywhere else (f32, and wgpu/lavapipe, which has
//!   neither tensor cores nor plane ops).
//!
//! Load balance across uneven block-rows comes from the work list built with the matrix (see
//! [`crate::bsr`]): long rows are cut along K into items with their own f32 partial sums, added
//! (with the bias) by a second kernel launched only for matrices that have such rows.
//!
//! Files: `blueprint.rs` (the launch shape and its validation), `staging.rs` (the work item, the
//! stage loads and the output writes both kernels share), `cmma.rs` (the tensor-core kernel),
//! `portable.rs` (the vectorised kernel), `reduce.rs` (the sum of the cut rows' partials), and
//! here the validated entry points.

mod blueprint;
mod cmma;
mod portable;
mod reduce;
mod staging;

use cubecl::prelude::*;
use ops::launch::check_same_dtype;
use ops::{caps, DType, DeviceTensor, OpsError, Result};

pub use blueprint::{blueprint, uses_tensor_cores, Blueprint, Tuning};

use crate::Bsr;
use blueprint::validate_blueprint;
use cmma::bsr_linear_cmma_kernel;
use portable::bsr_linear_scalar_kernel;
use reduce::bsr_split_reduce_kernel;
use staging::BsrArgsLaunch;

/// Block sizes the kernel is compiled for (the model prunes to 32x32 blocks where the shapes
/// allow, else 16x16).
pub const SUPPORTED_BLOCKS: [usize; 3] = [16, 32, 64];

/// `y = x · Wᵀ (+ bias)` for `x[.., K]` and `W[N, K]` in BSR; returns `y[.., N]`.
pub fn bsr_linear<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &Bsr<R>,
    bias: Option<&DeviceTensor<R>>,
) -> Result<DeviceTensor<R>> {
    let mut shape = x.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = w.shape()[0];
    }
    let out = DeviceTensor::empty(client, &shape, x.dtype());
    bsr_linear_into(client, x, w, bias, &out)?;
    Ok(out)
}

/// [`bsr_linear`] into a preallocated `out[.., N]`. Allocates nothing, except an f32 buffer of
/// partial sums for matrices whose work list cut some block-rows (see [`crate::bsr`]).
pub fn bsr_linear_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &Bsr<R>,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    bsr_linear_into_tuned(client, x, w, bias, out, Tuning::default())
}

/// [`bsr_linear_into`] with explicit launch-shape overrides (tuning sweeps).
pub fn bsr_linear_into_tuned<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &Bsr<R>,
    bias: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    tuning: Tuning,
) -> Result<()> {
    const OP: &str = "bsr_linear";
    let dtype = x.dtype();
    caps::check_float_dtype(client, OP, dtype)?;
    if w.dtype() != dtype {
        return Err(OpsError::UnsupportedDType {
            op: OP,
            dtype: w.dtype(),
            runtime: caps::runtime_name(client),
            detail: format!("the weight is {} but the input is {dtype}", w.dtype()),
        });
    }
    check_same_dtype(OP, x, out)?;
    let [n, k] = w.shape();
    let b = w.block_size();
    if !SUPPORTED_BLOCKS.contains(&b) {
        return Err(OpsError::invalid(
            OP,
            format!("block size {b} is not supported (use one of {SUPPORTED_BLOCKS:?})"),
        ));
    }
    if x.rank() == 0 || x.last_dim() != k || x.numel() == 0 {
        return Err(OpsError::shape(
            OP,
            format!("input {:?} for a weight [{n}, {k}]", x.shape()),
        ));
    }
    if !x.is_contiguous() || !out.is_contiguous() {
        return Err(OpsError::shape(OP, "input and output must be contiguous"));
    }
    let m = x.rows();
    let mut want = x.shape().to_vec();
    *want.last_mut().unwrap() = n;
    if out.shape() != want.as_slice() {
        return Err(OpsError::shape(
            OP,
            format!("output {:?}, expected {want:?}", out.shape()),
        ));
    }
    if let Some(bias) = bias {
        check_same_dtype(OP, x, bias)?;
        if bias.shape() != [n] || !bias.is_contiguous() {
            return Err(OpsError::shape(
                OP,
                format!("bias {:?}, expected [{n}]", bias.shape()),
            ));
        }
    }

    let plan = &w.plan;
    let bp = blueprint(client, dtype, b, m, plan.n_items, bias.is_some(), tuning);
    validate_blueprint(client, &bp, dtype)?;
    let m_tiles = m.div_ceil(bp.tile_m);
    let (max_x, max_y, _) = client.properties().hardware.max_cube_count;
    let reduce_y = (m * b).div_ceil(256);
    if plan.n_items > max_x as usize
        || m_tiles > max_y as usize
        || plan.n_splits > max_x as usize
        || reduce_y > max_y as usize
    {
        return Err(OpsError::invalid(
            OP,
            format!(
                "{m} rows x {} work items exceed the launch grid",
                plan.n_items
            ),
        ));
    }
    let partial = if plan.n_slots > 0 {
        DeviceTensor::empty(client, &[plan.n_slots, m, b], DType::F32)
    } else {
        plan.dummy_f32.clone()
    };
    let bias_t = bias.unwrap_or(&plan.dummy_bias);
    let count = CubeCount::Static(plan.n_items as u32, m_tiles as u32, 1);
    // The two kernels take the same arguments; each has its own types for them (the dtype and
    // vector width are chosen at launch), hence a macro rather than a shared value.
    macro_rules! launch_blocks {
        ($kernel:ident) => {
            $kernel::launch_unchecked::<R>(
                client,
                count,
                CubeDim::new_1d(bp.units as u32),
                bp.vector,
                BsrArgsLaunch::new(
                    x.as_buffer_arg(),
                    w.values().as_buffer_arg(),
                    w.col_indices().as_buffer_arg(),
                    plan.items.as_buffer_arg(),
                    bias_t.as_buffer_arg(),
                    out.as_buffer_arg(),
                    partial.as_buffer_arg(),
                    m,
                    k / bp.vector,
                    n,
                ),
                bp,
                dtype.elem_type(),
            )
        };
    }
    // SAFETY: the operands were validated against M, K and N above, and the blueprint against
    // the matrix whose work list the kernels walk.
    unsafe {
        if bp.use_cmma {
            launch_blocks!(bsr_linear_cmma_kernel);
        } else {
            launch_blocks!(bsr_linear_scalar_kernel);
        }
        if plan.n_splits > 0 {
            bsr_split_reduce_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(plan.n_splits as u32, reduce_y as u32, 1),
                CubeDim::new_1d(256),
                partial.as_buffer_arg(),
                plan.splits.as_buffer_arg(),
                bias_t.as_buffer_arg(),
                out.as_buffer_arg(),
                m,
                n,
                b,
                bias.is_some(),
                dtype.elem_type(),
            );
        }
    }
    Ok(())
}
