//! The model's linear projections, in whichever weight format the load options chose: dense (the
//! fused kernels: GEMV/GEMM with bias and residual epilogues, the fused gated MLP), or a
//! compressed layer (block-sparse after `--sparsify`, quantized after `--quant`): the 8-bit
//! layers add the residual in their GEMM epilogue, the others leave it to the element-wise add,
//! and all of them leave the SwiGLU to the element-wise kernel.

use cubecl::prelude::*;
use ops::matmul::{fused_gated_mlp_into, linear_into, Activation, GatedWeights};
use ops::{DType, DeviceTensor};
use quant::{ActScratch, Fp8Linear, QuantFormat, W4A16Linear, W8A8Linear};
use sparse::SparseLinear;

use crate::config::Qwen2Config;
use crate::qwen2::Weight;
use crate::Result;

/// A linear layer whose weight is not a dense matrix; it owns its bias.
// Held once per projection (four per layer): the variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum CompressedLayer<R: Runtime> {
    /// Block-sparse (BSR) weight from pruning: an accuracy trade-off the user asked for.
    Sparse(SparseLinear<R>),
    /// int8 weights per output channel, activations quantized per token (W8A8).
    W8A8(W8A8Linear<R>),
    /// fp8 e4m3 weights and activations, the same scaling as W8A8.
    Fp8(Fp8Linear<R>),
    /// int4 weights (per channel or per group along K), float activations.
    W4A16(W4A16Linear<R>),
}

impl<R: Runtime> CompressedLayer<R> {
    /// The product (plus `residual`) into `out`; the 8-bit layers quantize `x` into the
    /// scratch's buffers (allocated here when there is no scratch) and add the residual in their
    /// GEMM epilogue; the others write the product first (into `scratch.product` when given,
    /// since an output may not alias an input of the same launch) and add it after.
    fn forward_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        residual: Option<&DeviceTensor<R>>,
        out: &DeviceTensor<R>,
        scratch: Option<&ProjectionScratch<R>>,
    ) -> Result<()> {
        macro_rules! linear8 {
            ($l:expr, $act:ident) => {{
                let own;
                let act = match scratch {
                    Some(s) => &s.$act,
                    None => {
                        own = $l.scratch(client, x.rows());
                        &own
                    }
                };
                match residual {
                    Some(r) => $l.forward_residual_into(client, x, r, act, out)?,
                    None => $l.forward_into(client, x, act, out)?,
                }
            }};
        }
        match (self, residual) {
            (Self::W8A8(l), _) => linear8!(l, int8),
            (Self::Fp8(l), _) => linear8!(l, fp8),
            (_, Some(r)) => {
                let product = match scratch {
                    Some(s) => s.product.reshape(out.shape())?,
                    None => DeviceTensor::empty(client, out.shape(), out.dtype()),
                };
                self.forward_into(client, x, None, &product, scratch)?;
                ops::elementwise::add_into(client, &product, r, out)?;
            }
            (Self::Sparse(l), None) => l.forward_into(client, x, out)?,
            (Self::W4A16(l), None) => l.forward_into(client, x, out)?,
        }
        Ok(())
    }

    fn out_features(&self) -> usize {
        match self {
            Self::Sparse(l) => l.out_features(),
            Self::W8A8(l) => l.out_features(),
            Self::Fp8(l) => l.out_features(),
            Self::W4A16(l) => l.out_features(),
        }
    }

    /// Device bytes of the weight, its indices or scales, and the bias.
    fn bytes(&self) -> usize {
        match self {
            Self::Sparse(l) => {
                let w = &l.weight;
                let b = l.bias.as_ref().map_or(0, tensor_bytes);
                tensor_bytes(w.values())
                    + tensor_bytes(w.crow_indices())
                    + tensor_bytes(w.col_indices())
                    + b
            }
            Self::W8A8(l) => l.weight_bytes(),
            Self::Fp8(l) => l.weight_bytes(),
            Self::W4A16(l) => l.weight_bytes(),
        }
    }

    /// What the format is, for load reports.
    pub fn describe(&self) -> String {
        match self {
            Self::Sparse(l) => format!(
                "block-sparse {}x{}, density {:.2}",
                l.weight.block_size(),
                l.weight.block_size(),
                l.weight.density()
            ),
            Self::W8A8(_) => "int8 (W8A8)".into(),
            Self::Fp8(_) => "fp8 e4m3".into(),
            Self::W4A16(l) => match l.group_size() {
                Some(g) => format!("int4, group {g} (W4A16)"),
                None => "int4, per channel (W4A16)".into(),
            },
        }
    }
}

fn tensor_bytes<R: Runtime>(t: &DeviceTensor<R>) -> usize {
    t.numel() * t.dtype().size()
}

/// One projection `y = x · Wᵀ (+ b)` of the model, with `W` `[out, in]`.
// A model holds four per layer: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Projection<R: Runtime> {
    Dense {
        weight: Weight<R>,
        bias: Option<Weight<R>>,
    },
    Compressed {
        /// The checkpoint tensors it was made of (several for a fused projection).
        parts: Vec<String>,
        layer: CompressedLayer<R>,
    },
}

impl<R: Runtime> std::fmt::Debug for Projection<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dense { weight, .. } => write!(f, "{weight:?}"),
            Self::Compressed { parts, layer } => {
                write!(f, "{}: {}", parts.join(" + "), layer.describe())
            }
        }
    }
}

/// Intermediates of a compressed projection in the decode step (preallocated, so that the step
/// stays allocation-free): its bare product before the residual add, the gate-up product before
/// SwiGLU, and the quantized activation of the 8-bit layers.
pub struct ProjectionScratch<R: Runtime> {
    /// `[1, hidden]`.
    pub product: DeviceTensor<R>,
    /// `[1, 2 * intermediate]`.
    pub gate_up: DeviceTensor<R>,
    /// One row of the widest projection input, as int8 and as fp8 codes with their scale.
    pub int8: ActScratch<R>,
    pub fp8: ActScratch<R>,
}

impl<R: Runtime> ProjectionScratch<R> {
    pub fn new(client: &ComputeClient<R>, config: &Qwen2Config, dtype: DType) -> Self {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let widest = h.max(i).max(config.q_dim());
        Self {
            product: DeviceTensor::empty(client, &[1, h], dtype),
            gate_up: DeviceTensor::empty(client, &[1, 2 * i], dtype),
            int8: ActScratch::new(client, 1, widest, QuantFormat::Int8),
            fp8: ActScratch::new(client, 1, widest, QuantFormat::Fp8E4M3),
        }
    }
}

impl<R: Runtime> Projection<R> {
    /// The checkpoint tensors the weight was made of.
    pub fn parts(&self) -> &[String] {
        match self {
            Self::Dense { weight, .. } => &weight.parts,
            Self::Compressed { parts, .. } => parts,
        }
    }

    /// The dense uploads it holds (none for a compressed projection).
    pub fn dense_weights(&self) -> Vec<&Weight<R>> {
        match self {
            Self::Dense { weight, bias } => std::iter::once(weight).chain(bias).collect(),
            Self::Compressed { .. } => Vec::new(),
        }
    }

    pub fn is_dense(&self) -> bool {
        matches!(self, Self::Dense { .. })
    }

    /// Whether the decode step's launches for this projection allocate nothing, so that they
    /// can be captured in a CUDA graph: all but the sparse layer, whose kernel allocates its
    /// split-row partials per call (a replayed graph would keep writing to memory the pool has
    /// since handed to someone else). The quantized layers run from the step's scratch.
    pub fn graph_safe(&self) -> bool {
        !matches!(
            self,
            Self::Compressed {
                layer: CompressedLayer::Sparse(_),
                ..
            }
        )
    }

    /// Device bytes of the weight (and bias, scales, indices).
    pub fn bytes(&self) -> usize {
        match self {
            Self::Dense { weight, bias } => {
                tensor_bytes(&weight.tensor) + bias.as_ref().map_or(0, |b| tensor_bytes(&b.tensor))
            }
            Self::Compressed { layer, .. } => layer.bytes(),
        }
    }

    fn out_features(&self) -> usize {
        match self {
            Self::Dense { weight, .. } => weight.tensor.shape()[0],
            Self::Compressed { layer, .. } => layer.out_features(),
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
        *shape.last_mut().expect("activations have rank >= 1") = self.out_features();
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
        match self {
            Self::Dense { weight, bias } => dense_into(client, weight, bias, x, residual, out),
            Self::Compressed { layer, .. } => layer.forward_into(client, x, residual, out, scratch),
        }
    }

    /// The MLP's first half on a fused gate-up projection: `silu(x·Gᵀ) * (x·Uᵀ)` into `out`.
    /// Dense weights run the fused gated-MLP kernel (no intermediate in memory); a compressed
    /// one writes the `[.., 2I]` product (into `scratch.gate_up` when given) and applies SwiGLU.
    pub fn gated_mlp_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        out: &DeviceTensor<R>,
        scratch: Option<&ProjectionScratch<R>>,
    ) -> Result<()> {
        match self {
            Self::Dense { weight, .. } => {
                let w = GatedWeights::Concatenated(&weight.tensor);
                fused_gated_mlp_into(client, x, w, Activation::Silu, out)?;
            }
            Self::Compressed { layer, .. } => {
                let mut shape = x.shape().to_vec();
                *shape.last_mut().expect("activations have rank >= 1") = layer.out_features();
                let gate_up = match scratch {
                    Some(s) => s.gate_up.reshape(&shape)?,
                    None => DeviceTensor::empty(client, &shape, x.dtype()),
                };
                layer.forward_into(client, x, None, &gate_up, scratch)?;
                ops::elementwise::swiglu_concat_into(client, &gate_up, out)?;
            }
        }
        Ok(())
    }
}

/// The dense product with its epilogues (bias, residual) fused into the GEMV/GEMM.
fn dense_into<R: Runtime>(
    client: &ComputeClient<R>,
    weight: &Weight<R>,
    bias: &Option<Weight<R>>,
    x: &DeviceTensor<R>,
    residual: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    let bias = bias.as_ref().map(|b| &b.tensor);
    linear_into(client, x, &weight.tensor, bias, residual, out)?;
    Ok(())
}
