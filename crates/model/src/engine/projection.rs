//! The model's linear projections, in whichever weight format the load options chose, each an
//! [`ops::linear::Linear`]: dense (the fused kernels: GEMV/GEMM with the input RMSNorm, bias
//! and residual fused in, the fused gated MLP), or a compressed layer (block-sparse after
//! `--sparsify`, quantized after `--quant`), which applies what its kernels cannot fuse as
//! separate launches from preallocated scratch.

use cubecl::prelude::*;
use ops::gemm::SplitNeed;
use ops::linear::{DenseLinear, Epilogue, Linear, LinearWorkspace, NormedInput};
use ops::matmul::{Activation, InputNorm};
use ops::{DType, DeviceTensor};

use crate::config::ModelConfig;
use crate::Result;

/// An uploaded tensor and the checkpoint tensors it was made of: one (`parts == [name]`), or
/// several concatenated along the first dimension (the fused QKV and gate-up projections).
pub struct Weight<R: Runtime> {
    pub name: String,
    pub parts: Vec<String>,
    pub tensor: DeviceTensor<R>,
}

impl<R: Runtime> std::fmt::Debug for Weight<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:?}", self.name, self.tensor)
    }
}

fn tensor_bytes<R: Runtime>(t: &DeviceTensor<R>) -> usize {
    t.numel() * t.dtype().size()
}

/// One projection `y = x · Wᵀ (+ b)` of the model, with `W` `[out, in]`, in whichever weight
/// format the load chose: every format is an [`ops::linear::Linear`], so the layer code never
/// matches on it.
pub struct Projection<R: Runtime> {
    /// The checkpoint tensors the weight was made of (several for a fused projection).
    parts: Vec<String>,
    layer: Box<dyn Linear<R>>,
    /// The dense upload behind `layer` (`None` when the weight is compressed).
    dense: Option<Weight<R>>,
    bias: Option<Weight<R>>,
}

impl<R: Runtime> std::fmt::Debug for Projection<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.dense {
            Some(weight) => write!(f, "{weight:?}"),
            None => write!(f, "{}: {}", self.parts.join(" + "), self.layer.describe()),
        }
    }
}

/// Intermediates of a compressed projection in the decode step (preallocated, so that the step
/// stays allocation-free).
pub struct ProjectionScratch<R: Runtime> {
    pub linear: LinearWorkspace<R>,
}

impl<R: Runtime> ProjectionScratch<R> {
    /// Scratch for one token (one sequence's decode step: the fastest kernels for one row).
    pub fn new(client: &ComputeClient<R>, config: &ModelConfig, dtype: DType) -> Self {
        Self::for_rows(client, config, dtype, 1, false)
    }

    /// Scratch for `rows` tokens; with `rows_invariant`, for products whose rows must each get
    /// the result they get alone whatever the number of rows (a batched decode step).
    pub fn for_rows(
        client: &ComputeClient<R>,
        config: &ModelConfig,
        dtype: DType,
        rows: usize,
        rows_invariant: bool,
    ) -> Self {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let widest_in = h.max(i).max(config.q_dim());
        let widest_out = (2 * i).max(h).max(config.q_dim() + 2 * config.kv_dim());
        // The split-K scratch for the layer's own products ([N, K] of qkv, o, gate-up, down),
        // not for the loose bound of the widest output over the widest input.
        let products = [
            [config.q_dim() + 2 * config.kv_dim(), h],
            [h, config.q_dim()],
            [2 * i, h],
            [h, i],
        ];
        // The step's argmax over the logits splits each row across cubes with the same scratch.
        let need = products
            .iter()
            .map(|&[n, k]| ops::matmul::scratch_need(client, n, k))
            .fold(SplitNeed::default(), SplitNeed::max)
            .max(ops::argmax::split_need(
                client,
                rows,
                config.vocab_size,
                dtype,
            ));
        Self {
            linear: LinearWorkspace::with_split_need(
                client, rows, widest_in, widest_out, dtype, need,
            )
            .rows_invariant(rows_invariant),
        }
    }
}

impl<R: Runtime> Projection<R> {
    /// A dense `[out, in]` weight in the compute dtype (and its bias).
    pub fn dense(weight: Weight<R>, bias: Option<Weight<R>>) -> Result<Self> {
        let layer = DenseLinear::new(weight.tensor.clone())?;
        Ok(Self {
            parts: weight.parts.clone(),
            layer: Box::new(layer),
            dense: Some(weight),
            bias,
        })
    }

    /// A compressed layer made of the checkpoint tensors `parts`, with its bias (dense, in the
    /// compute dtype).
    pub fn compressed(
        parts: Vec<String>,
        layer: Box<dyn Linear<R>>,
        bias: Option<DeviceTensor<R>>,
    ) -> Self {
        let bias = bias.map(|tensor| Weight {
            name: format!("{} (bias)", parts.join(" + ")),
            parts: Vec::new(),
            tensor,
        });
        Self {
            parts,
            layer,
            dense: None,
            bias,
        }
    }

    /// The checkpoint tensors the weight was made of.
    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The dense uploads it holds (none for a compressed projection).
    pub fn dense_weights(&self) -> Vec<&Weight<R>> {
        match &self.dense {
            Some(weight) => std::iter::once(weight).chain(&self.bias).collect(),
            None => Vec::new(),
        }
    }

    pub fn is_dense(&self) -> bool {
        self.dense.is_some()
    }

    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// Whether the decode step's launches for this projection allocate nothing, so that they
    /// can be captured in a CUDA graph: all but the sparse layer, whose kernel allocates its
    /// split-row partials per call (a replayed graph would keep writing to memory the pool has
    /// since handed to someone else). The quantized layers run from the step's scratch.
    pub fn graph_safe(&self) -> bool {
        self.layer.graph_safe()
    }

    /// Device bytes of the weight (and bias, scales, indices).
    pub fn bytes(&self) -> usize {
        self.layer.weight_bytes() + self.bias.as_ref().map_or(0, |b| tensor_bytes(&b.tensor))
    }

    fn epilogue<'a>(&'a self, residual: Option<&'a DeviceTensor<R>>) -> Epilogue<'a, R> {
        let epilogue = Epilogue::NONE.bias(self.bias.as_ref().map(|b| &b.tensor));
        match residual {
            Some(r) => epilogue.residual(r),
            None => epilogue,
        }
    }

    /// `x · Wᵀ (+ b) (+ residual)`, allocating the output.
    pub fn forward(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        residual: Option<&DeviceTensor<R>>,
    ) -> Result<DeviceTensor<R>> {
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("activations have rank >= 1") = self.layer.out_rows();
        let out = DeviceTensor::empty(client, &shape, x.dtype());
        self.forward_into(client, x, residual, &out, None)?;
        Ok(out)
    }

    /// [`Self::forward`] into `out`; with a scratch, nothing is allocated.
    pub fn forward_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        residual: Option<&DeviceTensor<R>>,
        out: &DeviceTensor<R>,
        scratch: Option<&ProjectionScratch<R>>,
    ) -> Result<()> {
        let ws = scratch.map(|s| &s.linear);
        Ok(self
            .layer
            .forward_into(client, x, self.epilogue(residual), out, ws)?)
    }

    /// [`Self::forward_into`] of `rms_norm(x, norm)`: fused into the kernel where the format
    /// can (the dense decode GEMV), else through `normed` (x's shape and dtype).
    pub fn forward_normed_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        norm: InputNorm<'_, R>,
        normed: &DeviceTensor<R>,
        out: &DeviceTensor<R>,
        scratch: Option<&ProjectionScratch<R>>,
    ) -> Result<()> {
        let ws = scratch.map(|s| &s.linear);
        Ok(self.layer.forward_normed_into(
            client,
            NormedInput { x, norm, normed },
            self.epilogue(None),
            out,
            ws,
        )?)
    }

    /// The MLP's first half on a fused gate-up projection, on `rms_norm(x, norm)`:
    /// `silu(x̂·Gᵀ) * (x̂·Uᵀ)` into `out`. Dense weights run the fused gated-MLP kernel (no
    /// intermediate in memory); a compressed one writes the `[.., 2I]` product into the scratch
    /// and applies SwiGLU.
    pub fn gated_mlp_normed_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        norm: InputNorm<'_, R>,
        normed: &DeviceTensor<R>,
        out: &DeviceTensor<R>,
        scratch: Option<&ProjectionScratch<R>>,
    ) -> Result<()> {
        let epilogue = self.epilogue(None).gated(Activation::Silu);
        let ws = scratch.map(|s| &s.linear);
        Ok(self.layer.forward_normed_into(
            client,
            NormedInput { x, norm, normed },
            epilogue,
            out,
            ws,
        )?)
    }
}
