//! One capability for every linear-layer format: `y = x · Wᵀ`, followed by an [`Epilogue`]
//! (bias, residual, gated activation), into a preallocated output, with a [`LinearWorkspace`]
//! for the intermediates a format needs.
//!
//! [`Linear`] is implemented by the dense layer here ([`DenseLinear`]) and by the quantized
//! (`quant::{W8A8Linear, Fp8Linear, W4A16Linear}`) and block-sparse (`sparse::SparseLinear`)
//! layers, so that a model holds `Box<dyn Linear<R>>` and never matches on the format. Each
//! format applies what it can inside its kernel (the dense kernels fuse all three; the 8-bit
//! GEMM adds bias and residual in its epilogue) and the rest through [`unfused_epilogue`]: the
//! bare product into the workspace, then the element-wise add or SwiGLU.
//!
//! Layers own their weights, not their biases: the bias travels in the epilogue, so that one
//! layer type serves projections with and without one.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::gemm::{SplitNeed, SplitScratch};
use crate::matmul::{
    fused_gated_mlp_opts_into, linear_opts_into, Activation, GatedWeights, InputNorm,
    ProductOptions,
};
use crate::{DType, DeviceTensor, OpsError, Result};

/// What follows the product `x · Wᵀ`.
///
/// - `bias` `[N]` is added to every row (`N` the rows of `W`);
/// - `residual` `[.., N]` (the output's shape) is added after the bias; it must not be `out`;
/// - `activation` makes the layer gated: `W` holds `2I` rows, the gate rows then the matching
///   up rows, and the output `[.., I]` is `act(x · Gᵀ) * (x · Uᵀ)` (the gated MLP's first half).
pub struct Epilogue<'a, R: Runtime> {
    pub bias: Option<&'a DeviceTensor<R>>,
    pub residual: Option<&'a DeviceTensor<R>>,
    pub activation: Option<Activation>,
}

impl<R: Runtime> Clone for Epilogue<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for Epilogue<'_, R> {}

impl<R: Runtime> Default for Epilogue<'_, R> {
    fn default() -> Self {
        Self::NONE
    }
}

impl<'a, R: Runtime> Epilogue<'a, R> {
    /// The bare product.
    pub const NONE: Self = Self {
        bias: None,
        residual: None,
        activation: None,
    };

    /// `+ bias` (nothing when `None`).
    pub fn bias(self, bias: Option<&'a DeviceTensor<R>>) -> Self {
        Self { bias, ..self }
    }

    /// `+ residual`.
    pub fn residual(self, residual: &'a DeviceTensor<R>) -> Self {
        Self {
            residual: Some(residual),
            ..self
        }
    }

    /// Gated with `act` (see the type's docs).
    pub fn gated(self, act: Activation) -> Self {
        Self {
            activation: Some(act),
            ..self
        }
    }

    /// The output width for a weight of `rows` rows.
    pub fn out_width(&self, rows: usize) -> usize {
        if self.activation.is_some() {
            rows / 2
        } else {
            rows
        }
    }
}

/// Preallocated intermediates of [`Linear::forward_into`] for inputs of up to `max_rows` rows
/// of up to `max_in` features into weights of up to `max_out` rows, so that a decode step
/// allocates nothing (a captured CUDA graph must not allocate). Formats that cannot fuse an
/// epilogue write their bare product into [`Self::product`]; the 8-bit formats quantize the
/// activation into [`Self::codes`] (16-byte aligned rows of one byte per feature) and
/// a scale per row (f32). The decode products that split K across cubes keep their
/// partial sums in [`Self::split_k`].
pub struct LinearWorkspace<R: Runtime> {
    pub max_rows: usize,
    pub max_in: usize,
    pub max_out: usize,
    product: DeviceTensor<R>,
    codes: Handle,
    scales: DeviceTensor<R>,
    split_k: SplitScratch<R>,
    rows_invariant: bool,
}

/// Bytes of one row of `k` one-byte codes, padded to 16 bytes (the 8-bit kernels' row pitch).
pub fn code_row_pitch(k: usize) -> usize {
    k.div_ceil(16).max(1) * 16
}

impl<R: Runtime> LinearWorkspace<R> {
    /// Room for `max_rows` rows, `max_in` input features and `max_out` weight rows (for a
    /// gated layer, its `2I`), with products in `dtype`; the split-K scratch is sized for any
    /// `[max_out, max_in]` weight.
    pub fn new(
        client: &ComputeClient<R>,
        max_rows: usize,
        max_in: usize,
        max_out: usize,
        dtype: DType,
    ) -> Self {
        let need = crate::matmul::scratch_need(client, max_out.max(1), max_in.max(1));
        Self::with_split_need(client, max_rows, max_in, max_out, dtype, need)
    }

    /// [`Self::new`] with the split-K scratch sized for `need` (a bound tighter than the one
    /// taken from `max_in` and `max_out`, e.g. the largest of a model's projections' needs:
    /// [`crate::matmul::scratch_need`]).
    pub fn with_split_need(
        client: &ComputeClient<R>,
        max_rows: usize,
        max_in: usize,
        max_out: usize,
        dtype: DType,
        need: SplitNeed,
    ) -> Self {
        let (rows, k, n) = (max_rows.max(1), max_in.max(1), max_out.max(1));
        Self {
            max_rows: rows,
            max_in: k,
            max_out: n,
            product: DeviceTensor::empty(client, &[rows * n], dtype),
            codes: client.empty(rows * code_row_pitch(k)),
            scales: DeviceTensor::empty(client, &[rows], DType::F32),
            split_k: SplitScratch::new(client, need),
            rows_invariant: false,
        }
    }

    /// Asks the products run with this workspace to give each row the result it gets alone,
    /// whatever the number of rows (continuous batching: a sequence's text must not depend on
    /// what it is batched with); see [`crate::matmul::ProductOptions::rows_invariant`]. Off, one
    /// row runs on the kernel fastest for one row.
    pub fn rows_invariant(mut self, on: bool) -> Self {
        self.rows_invariant = on;
        self
    }

    /// Whether [`Self::rows_invariant`] is on.
    pub fn is_rows_invariant(&self) -> bool {
        self.rows_invariant
    }

    /// The split-K scratch of the decode products.
    pub fn split_k(&self) -> &SplitScratch<R> {
        &self.split_k
    }

    /// How the dense products run with `workspace`: its split-K scratch and row invariance
    /// (none and off without one).
    pub fn product_options(workspace: Option<&Self>) -> ProductOptions<'_, R> {
        ProductOptions {
            split_k: workspace.map(Self::split_k),
            rows_invariant: workspace.is_some_and(Self::is_rows_invariant),
            ..Default::default()
        }
    }

    fn check(
        &self,
        op: &'static str,
        rows: usize,
        width: usize,
        what: &str,
        max: usize,
    ) -> Result<()> {
        if rows > self.max_rows || width > max {
            return Err(OpsError::shape(
                op,
                format!(
                    "the linear workspace holds {} rows of {max} {what}, the call needs {rows} of {width}",
                    self.max_rows
                ),
            ));
        }
        Ok(())
    }

    /// A contiguous `shape` view of the product buffer (`shape`'s last dimension at most
    /// `max_out`, its rows at most `max_rows`), in the workspace's dtype.
    pub fn product(&self, op: &'static str, shape: &[usize]) -> Result<DeviceTensor<R>> {
        let width = shape.last().copied().unwrap_or(0);
        let rows = shape.iter().product::<usize>() / width.max(1);
        self.check(op, rows, width, "outputs", self.max_out)?;
        Ok(DeviceTensor::from_handle(
            self.product.handle().clone(),
            shape,
            self.product.dtype(),
        ))
    }

    /// The code buffer as `rows` rows of `k` one-byte codes of `dtype` (pitch
    /// [`code_row_pitch`]`(k)`), and the `[rows]` f32 scales.
    pub fn codes(
        &self,
        op: &'static str,
        rows: usize,
        k: usize,
        dtype: DType,
    ) -> Result<(DeviceTensor<R>, DeviceTensor<R>)> {
        self.check(op, rows, k, "input features", self.max_in)?;
        let pitch = code_row_pitch(k);
        let q = DeviceTensor::from_parts(self.codes.clone(), &[rows, k], &[pitch, 1], dtype);
        let s = DeviceTensor::from_parts(self.scales.handle().clone(), &[rows], &[1], DType::F32);
        Ok((q, s))
    }
}

/// The input of [`Linear::forward_normed_into`]: `x`, the RMSNorm to apply to it, and where the
/// normalized input goes when a kernel cannot fuse the norm (`normed`, x's shape and dtype).
pub struct NormedInput<'a, R: Runtime> {
    pub x: &'a DeviceTensor<R>,
    pub norm: InputNorm<'a, R>,
    pub normed: &'a DeviceTensor<R>,
}

impl<R: Runtime> Clone for NormedInput<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for NormedInput<'_, R> {}

impl<'a, R: Runtime> NormedInput<'a, R> {
    /// Runs the norm into `normed` (a separate launch) and returns it.
    pub fn unfused(&self, client: &ComputeClient<R>) -> Result<&'a DeviceTensor<R>> {
        let n = self.norm;
        crate::norm::rms_norm_into(client, self.x, n.weight, n.eps, self.normed)?;
        Ok(self.normed)
    }
}

/// A linear layer in some weight format.
pub trait Linear<R: Runtime>: Send + Sync {
    /// The logical weight's `[N, K]`: its rows (`2I` for the weight of a gated layer) and the
    /// features of x, whatever the stored layout.
    fn shape(&self) -> [usize; 2];
    /// Features of x (`K`).
    fn in_features(&self) -> usize {
        self.shape()[1]
    }
    /// Rows of `W` (`N`; `2I` for the weight of a gated layer).
    fn out_rows(&self) -> usize {
        self.shape()[0]
    }
    /// `x[.., K] · Wᵀ` followed by `epilogue`, into the contiguous `out[.., epilogue.out_width(N)]`
    /// of x's dtype. With a workspace large enough for the call nothing is allocated; without
    /// one, intermediates are allocated per call.
    fn forward_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()>;
    /// [`Self::forward_into`] of `rms_norm(input.x)`: the pre-norm block's RMSNorm and the
    /// projection that consumes it. A format whose kernel can fuse the norm does (the dense and
    /// int4 decode GEMVs, the fused 8-bit decode kernel); the others write the norm into
    /// `input.normed` first, as this default does.
    fn forward_normed_into(
        &self,
        client: &ComputeClient<R>,
        input: NormedInput<'_, R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        let normed = input.unfused(client)?;
        self.forward_into(client, normed, epilogue, out, workspace)
    }
    /// Device bytes of the weight and whatever the format keeps beside it (scales, indices).
    fn weight_bytes(&self) -> usize;
    /// The format, for load reports (e.g. `"int8 (W8A8)"`).
    fn describe(&self) -> String;
    /// Whether [`Self::forward_into`] with a workspace allocates nothing, so that it may be
    /// captured in a CUDA graph.
    fn graph_safe(&self) -> bool {
        true
    }

    /// [`Self::forward_into`] into a new output.
    fn forward(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        epilogue: Epilogue<'_, R>,
    ) -> Result<DeviceTensor<R>> {
        let mut shape = x.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = epilogue.out_width(self.out_rows());
        }
        let out = DeviceTensor::empty(client, &shape, x.dtype());
        self.forward_into(client, x, epilogue, &out, None)?;
        Ok(out)
    }
}

/// The epilogue of a format whose kernel only adds a bias: `product(dst, bias)` writes
/// `x · Wᵀ + bias` into `dst`; a residual or a gated activation then runs as an element-wise
/// kernel over the product, which lives in the workspace (or a temporary without one).
pub fn unfused_epilogue<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    epilogue: Epilogue<'_, R>,
    out: &DeviceTensor<R>,
    workspace: Option<&LinearWorkspace<R>>,
    product: impl FnOnce(&DeviceTensor<R>, Option<&DeviceTensor<R>>) -> Result<()>,
) -> Result<()> {
    match (epilogue.activation, epilogue.residual) {
        (None, None) => product(out, epilogue.bias),
        (Some(_), Some(_)) => Err(OpsError::invalid(
            op,
            "a gated epilogue with a residual is not supported",
        )),
        (Some(act), None) => {
            if act != Activation::Silu {
                return Err(OpsError::invalid(
                    op,
                    format!("the {act:?}-gated epilogue needs a dense weight (only SiLU here)"),
                ));
            }
            let mut shape = out.shape().to_vec();
            *shape.last_mut().expect("outputs have rank >= 1") *= 2;
            let tmp = scratch(client, op, &shape, out.dtype(), workspace)?;
            product(&tmp, epilogue.bias)?;
            crate::elementwise::swiglu_concat_into(client, &tmp, out)
        }
        (None, Some(residual)) => {
            let tmp = scratch(client, op, out.shape(), out.dtype(), workspace)?;
            product(&tmp, epilogue.bias)?;
            crate::elementwise::add_into(client, &tmp, residual, out)
        }
    }
}

fn scratch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    shape: &[usize],
    dtype: DType,
    workspace: Option<&LinearWorkspace<R>>,
) -> Result<DeviceTensor<R>> {
    match workspace {
        Some(w) if w.product.dtype() == dtype => w.product(op, shape),
        Some(w) => Err(OpsError::UnsupportedDType {
            op,
            dtype,
            runtime: "any",
            detail: format!("the linear workspace holds {} products", w.product.dtype()),
        }),
        None => Ok(DeviceTensor::empty(client, shape, dtype)),
    }
}

/// A dense weight `[N, K]` in the compute dtype: the GEMV/GEMM of [`crate::matmul`] with every
/// epilogue fused into the kernel.
pub struct DenseLinear<R: Runtime> {
    weight: DeviceTensor<R>,
}

impl<R: Runtime> Clone for DenseLinear<R> {
    fn clone(&self) -> Self {
        Self {
            weight: self.weight.clone(),
        }
    }
}

impl<R: Runtime> DenseLinear<R> {
    /// Wraps a `[N, K]` weight (PyTorch's layout).
    pub fn new(weight: DeviceTensor<R>) -> Result<Self> {
        if weight.rank() != 2 || weight.numel() == 0 || !weight.is_contiguous() {
            return Err(OpsError::shape(
                "DenseLinear::new",
                format!(
                    "the weight must be a non-empty contiguous [N, K] matrix, got {:?}",
                    weight.shape()
                ),
            ));
        }
        Ok(Self { weight })
    }

    pub fn weight(&self) -> &DeviceTensor<R> {
        &self.weight
    }
}

impl<R: Runtime> DenseLinear<R> {
    /// The dense kernels for `epilogue`, on x or (with `norm`) on its RMSNorm; with a workspace,
    /// the decode products may split K across cubes in its scratch.
    fn run(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        norm: Option<(InputNorm<'_, R>, &DeviceTensor<R>)>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        let (w, bias, residual) = (&self.weight, epilogue.bias, epilogue.residual);
        let opts = LinearWorkspace::product_options(workspace);
        let Some(act) = epilogue.activation else {
            return linear_opts_into(client, x, norm, w, bias, residual, out, opts);
        };
        if bias.is_some() || residual.is_some() {
            return Err(OpsError::invalid(
                "DenseLinear",
                "a gated epilogue takes no bias or residual",
            ));
        }
        let w = GatedWeights::Concatenated(w);
        fused_gated_mlp_opts_into(client, x, norm, w, act, out, opts)
    }
}

impl<R: Runtime> Linear<R> for DenseLinear<R> {
    fn shape(&self) -> [usize; 2] {
        [self.weight.shape()[0], self.weight.shape()[1]]
    }

    fn forward_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        self.run(client, x, None, epilogue, out, workspace)
    }

    fn forward_normed_into(
        &self,
        client: &ComputeClient<R>,
        input: NormedInput<'_, R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        let norm = Some((input.norm, input.normed));
        self.run(client, input.x, norm, epilogue, out, workspace)
    }

    fn weight_bytes(&self) -> usize {
        self.weight.numel() * self.weight.dtype().size()
    }

    fn describe(&self) -> String {
        format!("dense {}", self.weight.dtype())
    }
}
