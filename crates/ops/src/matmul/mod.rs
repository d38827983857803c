//! Dense matmul family: `linear` (y = x·wᵀ + b + r, PyTorch's weight layout) and the fused gated
//! MLP, dispatched by shape to a bandwidth-bound GEMV (decode, M <= 16) or a tiled GEMM
//! (prefill): tensor cores through `cmma` on CUDA for f16/bf16, a shared-memory tiled kernel
//! elsewhere.
//!
//! Dispatch rule (see [`plan`]): `M <= 16` → GEMV (weights streamed once at full bandwidth): one
//! row on the CUDA cores (one FMA per weight), 2 to 16 rows of bf16 on tensor cores (`mma`
//! m16n8k16, the rows of x padded to 16) where the runtime has them, else the CUDA cores;
//! [`ProductOptions::rows_invariant`] plans one row as 16 so that a row's result does not depend
//! on M (continuous batching). Otherwise the tensor-core GEMM when the
//! runtime reports an f16/bf16 `cmma` configuration of 16x16x16 with f32 accumulation, else the
//! tiled GEMM. Inputs must be contiguous (strided views are rejected with `ShapeMismatch`: the
//! kernels address rows by `row * K`).
//!
//! The tensor-core GEMM (`cmma`) feeds its shared-memory stages with a multi-stage `cp.async`
//! pipeline on CUDA and picks its tile per shape ([`CmmaTile::auto`]). [`linear_into_with`] and
//! [`fused_gated_mlp_into_with`] force a kernel (and a tile) with a [`MatmulStrategy`] (tests,
//! benchmark sweeps). The kernels share their epilogue, stage drivers and copies with the
//! other GEMM-like kernels through [`crate::gemm`].

use cubecl::prelude::*;

use crate::launch::check_same_dtype;
use crate::{caps, DeviceTensor, OpsError, Result};

/// Launches a dense kernel whose first buffers are `x, w, w_up, bias, residual, out` (the
/// operands of [`Problem::operands`]): `[$pre]` come before them (the vector width), `[$post]`
/// after (sizes, blueprint, dtype). Only for a validated [`Problem`] (shapes, dtypes and
/// contiguity checked by the public entry points), which keeps every kernel in bounds.
macro_rules! launch_dense {
    ($kernel:ident::<$r:ty>($client:expr, $count:expr, $dim:expr, $p:expr,
        [$($pre:expr),*], [$($post:expr),* $(,)?])) => {{
        let [x, w, w_up, bias, residual, out] = unsafe { $p.operands() };
        unsafe {
            $kernel::launch_unchecked::<$r>(
                $client, $count, $dim, $($pre,)* x, w, w_up, bias, residual, out, $($post,)*
            )
        }
    }};
}

mod cmma;
mod gemv;
mod mma_gemv;
mod strategy;
mod tiled;

/// The 1.5B model's decode products (name, `[m, k, n]`, epilogue, input norm) whose CUDA C++ the
/// GEMVs' source tests build: qkv, o, gate-up, down, the LM head at one row, gate-up at 16.
#[cfg(test)]
fn decode_products() -> [(
    &'static str,
    [usize; 3],
    crate::gemm::EpilogueBlueprint,
    bool,
); 6] {
    use crate::gemm::{Activation, EpilogueBlueprint};
    let linear = EpilogueBlueprint::linear;
    let gated = EpilogueBlueprint::gated(Activation::Silu);
    [
        ("qkv", [1, 1536, 2048], linear(true, false), true),
        ("o", [1, 1536, 1536], linear(false, true), false),
        ("gate_up", [1, 1536, 8960], gated, true),
        ("down", [1, 8960, 1536], linear(false, true), false),
        ("lm_head", [1, 1536, 151_936], linear(false, false), false),
        ("gate_up_16rows", [16, 1536, 8960], gated, true),
    ]
}

pub use crate::gemm::Activation;
pub use cmma::{CmmaBlueprint, CmmaTile};
pub(crate) use gemv::dot as gemv_dot;
pub use gemv::{gemv_lanes, gemv_splits, GemvBlueprint};
pub use mma_gemv::{TensorGemvBlueprint, TensorGemvShape, MAX_CUBE_SPLITS};
use strategy::plan_with;
pub use strategy::{
    plan, plan_rows_invariant, scratch_need, Kernel, MatmulStrategy, ProductOptions,
};
pub use tiled::TiledBlueprint;

/// Rows of x up to which the GEMV paths (CUDA-core or tensor-core) are used.
pub const GEMV_MAX_M: usize = 16;

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

/// The RMSNorm over the last dimension that a product applies to its input first:
/// `x̂ = rms_norm(x, weight, eps)`, rounded as [`crate::norm::rms_norm`] rounds. The decode-size
/// GEMVs (M <= [`GEMV_MAX_M`]) compute it inside the kernel (each cube reduces the row's squares
/// itself); larger products run [`crate::norm::rms_norm_into`] into a caller's buffer first.
pub struct InputNorm<'a, R: Runtime> {
    /// `[K]`, the activation dtype.
    pub weight: &'a DeviceTensor<R>,
    pub eps: f32,
}

impl<R: Runtime> Clone for InputNorm<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for InputNorm<'_, R> {}

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
    /// An RMSNorm the kernel applies to x first (only the two GEMVs fuse one).
    norm: Option<InputNorm<'a, R>>,
}

impl<R: Runtime> Problem<'_, R> {
    /// The epilogue the kernels compile in.
    fn epilogue(&self) -> crate::gemm::EpilogueBlueprint {
        crate::gemm::EpilogueBlueprint {
            has_bias: self.bias.is_some(),
            has_residual: self.residual.is_some(),
            gate: self.gated,
        }
    }

    /// The buffers every dense kernel takes first: `x, w, w_up, bias, residual, out`. Absent
    /// epilogue operands are bound to x (never read: the kernels' comptime flags skip them).
    ///
    /// # Safety
    /// The kernel they are given to must stay within the validated shapes.
    unsafe fn operands(&self) -> [BufferArg<R>; 6] {
        let bias = self.bias.unwrap_or(self.x);
        let residual = self.residual.unwrap_or(self.x);
        unsafe {
            [
                self.x.as_buffer_arg(),
                self.w.as_buffer_arg(),
                self.w_up.as_buffer_arg(),
                bias.as_buffer_arg(),
                residual.as_buffer_arg(),
                self.out.as_buffer_arg(),
            ]
        }
    }
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
    linear_impl(
        client,
        x,
        w,
        bias,
        residual,
        out,
        None,
        MatmulStrategy::Auto.into(),
    )
}

/// [`linear_into`] of `rms_norm(x, norm.weight, norm.eps)` (see [`InputNorm`]): one kernel for
/// decode-size inputs; larger ones write the normalized input into `normed` (x's shape and
/// dtype) first.
#[allow(clippy::too_many_arguments)]
pub fn linear_normed_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    norm: InputNorm<'_, R>,
    normed: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    residual: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    let norm = Some((norm, normed));
    linear_impl(
        client,
        x,
        w,
        bias,
        residual,
        out,
        norm,
        MatmulStrategy::Auto.into(),
    )
}

/// [`linear_normed_into`] on the kernel `strategy` asks for.
#[allow(clippy::too_many_arguments)]
pub fn linear_normed_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    norm: InputNorm<'_, R>,
    normed: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    residual: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    strategy: MatmulStrategy,
) -> Result<()> {
    linear_impl(
        client,
        x,
        w,
        bias,
        residual,
        out,
        Some((norm, normed)),
        strategy.into(),
    )
}

/// [`linear_into`] on the kernel `strategy` asks for (errors: see [`MatmulStrategy`]).
pub fn linear_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    bias: Option<&DeviceTensor<R>>,
    residual: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    strategy: MatmulStrategy,
) -> Result<()> {
    linear_impl(client, x, w, bias, residual, out, None, strategy.into())
}

/// [`linear_into`] with everything optional: an input norm (as [`linear_normed_into`]), the
/// kernel and a split-K scratch ([`ProductOptions`]).
#[allow(clippy::too_many_arguments)]
pub fn linear_opts_into<'a, R: Runtime>(
    client: &ComputeClient<R>,
    x: &'a DeviceTensor<R>,
    norm: Option<(InputNorm<'a, R>, &'a DeviceTensor<R>)>,
    w: &'a DeviceTensor<R>,
    bias: Option<&'a DeviceTensor<R>>,
    residual: Option<&'a DeviceTensor<R>>,
    out: &'a DeviceTensor<R>,
    opts: ProductOptions<'a, R>,
) -> Result<()> {
    linear_impl(client, x, w, bias, residual, out, norm, opts)
}

/// [`fused_gated_mlp_into`] with everything optional: an input norm (as
/// [`fused_gated_mlp_normed_into`]), the kernel and a split-K scratch ([`ProductOptions`]).
pub fn fused_gated_mlp_opts_into<'a, R: Runtime>(
    client: &ComputeClient<R>,
    x: &'a DeviceTensor<R>,
    norm: Option<(InputNorm<'a, R>, &'a DeviceTensor<R>)>,
    weights: GatedWeights<'a, R>,
    act: Activation,
    out: &'a DeviceTensor<R>,
    opts: ProductOptions<'a, R>,
) -> Result<()> {
    gated_impl(client, x, weights, act, out, norm, opts)
}

/// An input norm and the buffer its output goes to when the kernel cannot fuse it.
type NormArg<'a, R> = Option<(InputNorm<'a, R>, &'a DeviceTensor<R>)>;

#[allow(clippy::too_many_arguments)]
fn linear_impl<'a, R: Runtime>(
    client: &ComputeClient<R>,
    x: &'a DeviceTensor<R>,
    w: &'a DeviceTensor<R>,
    bias: Option<&'a DeviceTensor<R>>,
    residual: Option<&'a DeviceTensor<R>>,
    out: &'a DeviceTensor<R>,
    norm: NormArg<'a, R>,
    opts: ProductOptions<'a, R>,
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
        norm: None,
    };
    check_epilogue(OP, &p)?;
    launch_normed(client, OP, p, norm, opts)
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
    gated_impl(
        client,
        x,
        weights,
        act,
        out,
        None,
        MatmulStrategy::Auto.into(),
    )
}

/// [`fused_gated_mlp_into`] of `rms_norm(x, norm.weight, norm.eps)` (see [`InputNorm`] and
/// [`linear_normed_into`]).
pub fn fused_gated_mlp_normed_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    norm: InputNorm<'_, R>,
    normed: &DeviceTensor<R>,
    weights: GatedWeights<'_, R>,
    act: Activation,
    out: &DeviceTensor<R>,
) -> Result<()> {
    let norm = Some((norm, normed));
    gated_impl(
        client,
        x,
        weights,
        act,
        out,
        norm,
        MatmulStrategy::Auto.into(),
    )
}

/// [`fused_gated_mlp_normed_into`] on the kernel `strategy` asks for.
#[allow(clippy::too_many_arguments)]
pub fn fused_gated_mlp_normed_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    norm: InputNorm<'_, R>,
    normed: &DeviceTensor<R>,
    weights: GatedWeights<'_, R>,
    act: Activation,
    out: &DeviceTensor<R>,
    strategy: MatmulStrategy,
) -> Result<()> {
    gated_impl(
        client,
        x,
        weights,
        act,
        out,
        Some((norm, normed)),
        strategy.into(),
    )
}

/// [`fused_gated_mlp_into`] on the kernel `strategy` asks for (errors: see
/// [`MatmulStrategy`]).
pub fn fused_gated_mlp_into_with<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weights: GatedWeights<'_, R>,
    act: Activation,
    out: &DeviceTensor<R>,
    strategy: MatmulStrategy,
) -> Result<()> {
    gated_impl(client, x, weights, act, out, None, strategy.into())
}

fn gated_impl<'a, R: Runtime>(
    client: &ComputeClient<R>,
    x: &'a DeviceTensor<R>,
    weights: GatedWeights<'a, R>,
    act: Activation,
    out: &'a DeviceTensor<R>,
    norm: NormArg<'a, R>,
    opts: ProductOptions<'a, R>,
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
        norm: None,
    };
    check_epilogue(OP, &p)?;
    launch_normed(client, OP, p, norm, opts)
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

/// Validates the input norm and runs `p` on it: fused into the GEMV, or as an RMSNorm into
/// `normed` followed by the product on `normed` for the other kernels.
fn launch_normed<'a, R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    mut p: Problem<'a, R>,
    norm: NormArg<'a, R>,
    opts: ProductOptions<'a, R>,
) -> Result<()> {
    let Some((norm, normed)) = norm else {
        return launch(client, op, &p, opts);
    };
    crate::norm::check_eps(op, norm.eps)?;
    crate::norm::check_weight(op, p.x, norm.weight)?;
    check_same_dtype(op, p.x, normed)?;
    check_contiguous(op, normed, "normed")?;
    if normed.shape() != p.x.shape() {
        return Err(OpsError::shape(
            op,
            format!(
                "normed {:?}, expected x's {:?}",
                normed.shape(),
                p.x.shape()
            ),
        ));
    }
    if matches!(
        kernel_for(client, op, &p, opts)?,
        Kernel::Gemv | Kernel::TensorGemv
    ) {
        p.norm = Some(norm);
        launch(client, op, &p, opts)
    } else {
        crate::norm::rms_norm_into(client, p.x, norm.weight, norm.eps, normed)?;
        p.x = normed;
        launch(client, op, &p, opts)
    }
}

/// The kernel `strategy` runs `p` on (errors: see [`MatmulStrategy`]).
fn kernel_for<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    opts: ProductOptions<'_, R>,
) -> Result<Kernel> {
    Ok(match opts.strategy {
        MatmulStrategy::Auto => plan_with(client, p.m, p.k, p.x.dtype(), opts.rows_invariant),
        MatmulStrategy::Gemv | MatmulStrategy::GemvSplit(_) | MatmulStrategy::TensorGemv(_)
            if p.m > GEMV_MAX_M =>
        {
            return Err(OpsError::invalid(
                op,
                format!("the GEMV takes at most {GEMV_MAX_M} rows, not {}", p.m),
            ))
        }
        MatmulStrategy::GemvSplit(s) if !matches!(s, 1 | 2 | 4 | 8) => {
            return Err(OpsError::invalid(
                op,
                format!("the GEMV splits K over 1, 2, 4 or 8 groups, not {s}"),
            ))
        }
        MatmulStrategy::Gemv | MatmulStrategy::GemvSplit(_) => Kernel::Gemv,
        MatmulStrategy::TensorGemv(_) if !mma_gemv::supported(client, p.x.dtype(), p.k) => {
            return Err(OpsError::UnsupportedFeature {
                op,
                runtime: caps::runtime_name(client),
                feature: format!(
                    "mma m16n8k16 with {} inputs and K a multiple of 8 (K = {})",
                    p.x.dtype(),
                    p.k
                ),
            })
        }
        MatmulStrategy::TensorGemv(_) => Kernel::TensorGemv,
        MatmulStrategy::Tiled => Kernel::Tiled,
        MatmulStrategy::TensorCore(_) if !cmma::supported(client, p.x.dtype()) => {
            return Err(OpsError::UnsupportedFeature {
                op,
                runtime: caps::runtime_name(client),
                feature: format!(
                    "16x16x16 cmma with {} inputs and f32 accumulation",
                    p.x.dtype()
                ),
            })
        }
        MatmulStrategy::TensorCore(_) => Kernel::TensorCore,
    })
}

fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    opts: ProductOptions<'_, R>,
) -> Result<()> {
    let strategy = opts.strategy;
    match kernel_for(client, op, p, opts)? {
        Kernel::Gemv => {
            let splits = match strategy {
                MatmulStrategy::GemvSplit(s) => Some(s),
                _ => None,
            };
            gemv::launch(client, p, splits)
        }
        Kernel::TensorGemv => {
            let shape = match strategy {
                MatmulStrategy::TensorGemv(shape) => shape,
                _ => None,
            };
            mma_gemv::launch(client, op, p, shape, opts.split_k)?;
        }
        Kernel::Tiled => tiled::launch(client, p),
        Kernel::TensorCore => {
            let tile = match strategy {
                MatmulStrategy::TensorCore(tile) => tile,
                _ => CmmaTile::auto(
                    p.m,
                    p.n,
                    p.k,
                    p.gated.is_some(),
                    caps::num_sms(client) as usize,
                ),
            };
            cmma::launch(client, op, p, tile)?;
        }
    }
    Ok(())
}
