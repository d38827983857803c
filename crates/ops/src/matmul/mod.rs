//! Dense matmul family: `linear` (y = x·wᵀ + b + r, PyTorch's weight layout) and the fused gated
//! MLP, dispatched by shape to a bandwidth-bound GEMV (decode, M <= 16) or a tiled GEMM
//! (prefill): tensor cores through `cmma` on CUDA for f16/bf16, a shared-memory tiled kernel
//! elsewhere.
//!
//! Dispatch rule (see [`plan`]): `M <= 16` → GEMV (weights streamed once at full bandwidth; a
//! tensor-core tile would waste most of its rows). Otherwise the tensor-core GEMM when the
//! runtime reports an f16/bf16 `cmma` configuration of 16x16x16 with f32 accumulation, else the
//! tiled GEMM. Inputs must be contiguous (strided views are rejected with `ShapeMismatch`: the
//! kernels address rows by `row * K`).
//!
//! The tensor-core GEMM (`cmma_gemm`) feeds its shared-memory stages with a multi-stage
//! `cp.async` pipeline on CUDA, picks its tile per shape ([`CmmaTile::auto`]) and takes a tile
//! from [`TUNE_ENV`] for benchmark sweeps; [`linear_into_with_tile`] and
//! [`fused_gated_mlp_into_with_tile`] force one (tests).

mod cmma_gemm;
mod gemv;
mod tiled;

use cubecl::prelude::*;

use crate::launch::check_same_dtype;
use crate::{caps, DeviceTensor, OpsError, Result};

pub use cmma_gemm::{CmmaTile, TUNE_ENV};
pub use gemv::GemvPlan;
pub use tiled::TilePlan;

/// Rows of x up to which the GEMV path is used.
pub const GEMV_MAX_M: usize = 16;

/// The gate activation of [`fused_gated_mlp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// `x * sigmoid(x)` (Qwen2, Llama).
    #[default]
    Silu,
    /// PyTorch's default `F.gelu` (exact, erf).
    Gelu,
}

/// The two weights of a gated MLP.
pub enum GatedWeights<'a, R: Runtime> {
    /// `gate[I, H]` and `up[I, H]`.
    Separate {
        gate: &'a DeviceTensor<R>,
        up: &'a DeviceTensor<R>,
    },
    /// One `[2I, H]` matrix: the gate rows, then the up rows.
    Concatenated(&'a DeviceTensor<R>),
}

/// Which kernel a product runs on (exposed for benchmarks and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Gemv,
    TensorCore,
    Tiled,
}

/// The kernel `linear` picks for `m` rows of `dtype` on this runtime.
pub fn plan<R: Runtime>(client: &ComputeClient<R>, m: usize, dtype: crate::DType) -> Kernel {
    if m <= GEMV_MAX_M {
        Kernel::Gemv
    } else if cmma_gemm::supported(client, dtype) {
        Kernel::TensorCore
    } else {
        Kernel::Tiled
    }
}

/// Everything the launchers need, validated.
struct Problem<'a, R: Runtime> {
    x: &'a DeviceTensor<R>,
    w: &'a DeviceTensor<R>,
    w_up: &'a DeviceTensor<R>,
    up_row_offset: usize,
    bias: Option<&'a DeviceTensor<R>>,
    residual: Option<&'a DeviceTensor<R>>,
    out: &'a DeviceTensor<R>,
    m: usize,
    n: usize,
    k: usize,
    gated: Option<Activation>,
}

fn check_contiguous<R: Runtime>(op: &'static str, t: &DeviceTensor<R>, what: &str) -> Result<()> {
    if !t.is_contiguous() {
        return Err(OpsError::shape(
            op,
            format!("{what} must be contiguous (strided views are not supported)"),
        ));
    }
    Ok(())
}

/// `y = x·wᵀ (+ bias) (+ residual)` with `x[.., K]`, `w[N, K]`, `bias[N]`, `residual[.., N]`.
pub fn linear<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    residual: Option<&DeviceTensor<R>>,
) -> Result<DeviceTensor<R>> {
    let mut shape = x.shape().to_vec();
    if let (Some(last), [n, _]) = (shape.last_mut(), w.shape()) {
        *last = *n;
    }
    let out = DeviceTensor::empty(client, &shape, x.dtype());
    linear_into(client, x, w, bias, residual, &out)?;
    Ok(out)
}

/// [`linear`] into a preallocated `out[.., N]` (must not alias an input).
pub fn linear_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    residual: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    linear_impl(client, x, w, bias, residual, out, None)
}

/// [`linear_into`] forced onto the tensor-core GEMM with `tile` at any M (tests and tuning).
/// Fails with `UnsupportedFeature` where the runtime has no f16/bf16 `cmma` (see [`plan`]) and
/// `InvalidArgument` for a tile the kernel cannot run (see [`CmmaTile::is_valid`]). A tile with
/// `stages >= 2` runs the register-staged path where `cp.async` cannot be used.
pub fn linear_into_with_tile<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    residual: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    tile: CmmaTile,
) -> Result<()> {
    linear_impl(client, x, w, bias, residual, out, Some(tile))
}

fn linear_impl<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    residual: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    tile: Option<CmmaTile>,
) -> Result<()> {
    const OP: &str = "linear";
    let (m, k) = check_x(client, OP, x)?;
    check_same_dtype(OP, x, w)?;
    check_contiguous(OP, w, "w")?;
    let n = match w.shape() {
        [n, wk] if *wk == k && *n > 0 => *n,
        other => return Err(OpsError::shape(OP, format!("w {other:?} must be [N, {k}]"))),
    };
    let p = Problem {
        x,
        w,
        w_up: w,
        up_row_offset: 0,
        bias,
        residual,
        out,
        m,
        n,
        k,
        gated: None,
    };
    check_epilogue(OP, &p)?;
    launch(client, OP, &p, tile)
}

/// `act(x·gateᵀ) * (x·upᵀ)` in one kernel: `x[.., H]` -> `[.., I]`; both products share the x
/// tile and the intermediate never reaches memory.
pub fn fused_gated_mlp<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weights: GatedWeights<'_, R>,
    act: Activation,
) -> Result<DeviceTensor<R>> {
    let inter = match &weights {
        GatedWeights::Separate { gate, .. } => gate.shape().first().copied().unwrap_or(0),
        GatedWeights::Concatenated(w) => w.shape().first().copied().unwrap_or(0) / 2,
    };
    let mut shape = x.shape().to_vec();
    if let Some(last) = shape.last_mut() {
        *last = inter;
    }
    let out = DeviceTensor::empty(client, &shape, x.dtype());
    fused_gated_mlp_into(client, x, weights, act, &out)?;
    Ok(out)
}

/// [`fused_gated_mlp`] into a preallocated `out[.., I]`.
pub fn fused_gated_mlp_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weights: GatedWeights<'_, R>,
    act: Activation,
    out: &DeviceTensor<R>,
) -> Result<()> {
    gated_impl(client, x, weights, act, out, None)
}

/// [`fused_gated_mlp_into`] forced onto the tensor-core GEMM with `tile` (whose `bn` counts
/// gate and up rows: it covers `bn / 2` output columns); errors as [`linear_into_with_tile`].
pub fn fused_gated_mlp_into_with_tile<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weights: GatedWeights<'_, R>,
    act: Activation,
    out: &DeviceTensor<R>,
    tile: CmmaTile,
) -> Result<()> {
    gated_impl(client, x, weights, act, out, Some(tile))
}

fn gated_impl<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weights: GatedWeights<'_, R>,
    act: Activation,
    out: &DeviceTensor<R>,
    tile: Option<CmmaTile>,
) -> Result<()> {
    const OP: &str = "fused_gated_mlp";
    let (m, k) = check_x(client, OP, x)?;
    let (gate, up, inter, offset) = match weights {
        GatedWeights::Separate { gate, up } => {
            if gate.shape() != up.shape() {
                return Err(OpsError::shape(
                    OP,
                    format!("gate {:?} and up {:?} differ", gate.shape(), up.shape()),
                ));
            }
            (gate, up, gate.shape().first().copied().unwrap_or(0), 0)
        }
        GatedWeights::Concatenated(w) => {
            let rows = w.shape().first().copied().unwrap_or(0);
            if rows % 2 != 0 {
                return Err(OpsError::shape(
                    OP,
                    format!("concatenated weight {:?} has an odd row count", w.shape()),
                ));
            }
            (w, w, rows / 2, rows / 2)
        }
    };
    for t in [gate, up] {
        check_same_dtype(OP, x, t)?;
        check_contiguous(OP, t, "weights")?;
        if t.rank() != 2 || t.shape()[1] != k || inter == 0 {
            return Err(OpsError::shape(
                OP,
                format!("weight {:?} must be [I, {k}] (or [2I, {k}])", t.shape()),
            ));
        }
    }
    let p = Problem {
        x,
        w: gate,
        w_up: up,
        up_row_offset: offset,
        bias: None,
        residual: None,
        out,
        m,
        n: inter,
        k,
        gated: Some(act),
    };
    check_epilogue(OP, &p)?;
    launch(client, OP, &p, tile)
}

/// A gated MLP as a module: the weights and the activation.
pub struct FusedGatedMlp<R: Runtime> {
    /// `[2I, H]` (gate rows then up rows), or the pair.
    pub gate_up: GatedMlpWeights<R>,
    pub act: Activation,
}

/// Owned form of [`GatedWeights`].
pub enum GatedMlpWeights<R: Runtime> {
    Separate {
        gate: DeviceTensor<R>,
        up: DeviceTensor<R>,
    },
    Concatenated(DeviceTensor<R>),
}

impl<R: Runtime> FusedGatedMlp<R> {
    pub fn forward(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
    ) -> Result<DeviceTensor<R>> {
        let w = match &self.gate_up {
            GatedMlpWeights::Separate { gate, up } => GatedWeights::Separate { gate, up },
            GatedMlpWeights::Concatenated(w) => GatedWeights::Concatenated(w),
        };
        fused_gated_mlp(client, x, w, self.act)
    }
}

/// Validates x and returns `(M, K)` (leading dims flattened).
fn check_x<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    x: &DeviceTensor<R>,
) -> Result<(usize, usize)> {
    caps::check_float_dtype(client, op, x.dtype())?;
    check_contiguous(op, x, "x")?;
    if x.rank() == 0 || x.numel() == 0 {
        return Err(OpsError::shape(
            op,
            format!("x {:?} must be non-empty", x.shape()),
        ));
    }
    Ok((x.rows(), x.last_dim()))
}

fn check_epilogue<R: Runtime>(op: &'static str, p: &Problem<'_, R>) -> Result<()> {
    let mut out_shape = p.x.shape().to_vec();
    *out_shape.last_mut().expect("rank >= 1") = p.n;
    check_same_dtype(op, p.x, p.out)?;
    check_contiguous(op, p.out, "out")?;
    if p.out.shape() != out_shape.as_slice() {
        return Err(OpsError::shape(
            op,
            format!("out {:?}, expected {out_shape:?}", p.out.shape()),
        ));
    }
    if let Some(b) = p.bias {
        check_same_dtype(op, p.x, b)?;
        check_contiguous(op, b, "bias")?;
        if b.shape() != [p.n] {
            return Err(OpsError::shape(
                op,
                format!("bias {:?}, expected [{}]", b.shape(), p.n),
            ));
        }
    }
    if let Some(r) = p.residual {
        check_same_dtype(op, p.x, r)?;
        check_contiguous(op, r, "residual")?;
        if r.shape() != out_shape.as_slice() {
            return Err(OpsError::shape(
                op,
                format!("residual {:?}, expected {out_shape:?}", r.shape()),
            ));
        }
    }
    Ok(())
}

fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    tile: Option<CmmaTile>,
) -> Result<()> {
    // Unused epilogue operands are bound to x (never read: the kernel's comptime flags skip them).
    let bias = p.bias.unwrap_or(p.x);
    let residual = p.residual.unwrap_or(p.x);
    let dtype = p.x.dtype().elem_type();
    let kernel = match tile {
        Some(_) if !cmma_gemm::supported(client, p.x.dtype()) => {
            return Err(OpsError::UnsupportedFeature {
                op,
                runtime: caps::runtime_name(client),
                feature: format!(
                    "16x16x16 cmma with {} inputs and f32 accumulation",
                    p.x.dtype()
                ),
            })
        }
        Some(_) => Kernel::TensorCore,
        None => plan(client, p.m, p.x.dtype()),
    };
    match kernel {
        Kernel::Gemv => {
            let vector = caps::vector_size_for(client, p.x.dtype(), p.k);
            let use_plane = caps::has_plane_ops(client)
                && client.properties().hardware.plane_size_min
                    == client.properties().hardware.plane_size_max;
            let lanes = if use_plane {
                caps::plane_size_min(client)
            } else {
                32
            };
            let cols_per_cube = (256 / lanes).max(1);
            let gp = GemvPlan {
                m: p.m as u32,
                lanes,
                cols_per_cube,
                use_plane,
                has_bias: p.bias.is_some(),
                has_residual: p.residual.is_some(),
                gated: p.gated.is_some(),
                gelu: p.gated == Some(Activation::Gelu),
            };
            let cubes = p.n.div_ceil(cols_per_cube as usize) as u32;
            unsafe {
                gemv::gemv_kernel::launch_unchecked::<R>(
                    client,
                    crate::launch::cube_count_1d(client, cubes),
                    CubeDim::new_2d(lanes, cols_per_cube),
                    vector,
                    p.x.as_buffer_arg(),
                    p.w.as_buffer_arg(),
                    p.w_up.as_buffer_arg(),
                    bias.as_buffer_arg(),
                    residual.as_buffer_arg(),
                    p.out.as_buffer_arg(),
                    p.n,
                    p.k / vector,
                    p.up_row_offset,
                    gp,
                    dtype,
                );
            }
        }
        Kernel::TensorCore => cmma_gemm::launch(client, op, p, bias, residual, tile)?,
        Kernel::Tiled => {
            let tp = TilePlan {
                bm: 64,
                bn: 64,
                bk: 16,
                tm: 4,
                tn: 4,
                group_m: 8,
                has_bias: p.bias.is_some(),
                has_residual: p.residual.is_some(),
                gated: p.gated.is_some(),
                gelu: p.gated == Some(Activation::Gelu),
            };
            let tiles = p.m.div_ceil(tp.bm as usize) * p.n.div_ceil(tp.bn as usize);
            unsafe {
                tiled::tiled_gemm_kernel::launch_unchecked::<R>(
                    client,
                    crate::launch::cube_count_1d(client, tiles as u32),
                    CubeDim::new_1d(tp.units()),
                    p.x.as_buffer_arg(),
                    p.w.as_buffer_arg(),
                    p.w_up.as_buffer_arg(),
                    bias.as_buffer_arg(),
                    residual.as_buffer_arg(),
                    p.out.as_buffer_arg(),
                    p.m,
                    p.n,
                    p.k,
                    p.up_row_offset,
                    tp,
                    dtype,
                );
            }
        }
    }
    Ok(())
}
