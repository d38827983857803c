//! The model's linear projections, in whichever weight format the load options chose: dense (the
//! fused kernels: GEMV/GEMM with bias and residual epilogues, the fused gated MLP), or a
//! compressed layer (block-sparse after `--sparsify`, quantized after `--quant`): the 8-bit
//! layers add the residual in their GEMM epilogue, the others leave it to the element-wise add,
//! and all of them leave the SwiGLU to the element-wise kernel.

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, LinearWorkspace};
use ops::matmul::{fused_gated_mlp_into, linear_into, Activation, GatedWeights};
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
        layer: Box<dyn Linear<R>>,
        bias: Option<DeviceTensor<R>>,
    },
}

impl<R: Runtime> std::fmt::Debug for Projection<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dense { weight, .. } => write!(f, "{weight:?}"),
            Self::Compressed { parts, layer, .. } => {
                write!(f, "{}: {}", parts.join(" + "), layer.describe())
            }
        }
    }
}

/// Intermediates of a compressed projection in the decode step (preallocated, so that the step
/// stays allocation-free).
pub struct ProjectionScratch<R: Runtime> {
    pub linear: LinearWorkspace<R>,
}

impl<R: Runtime> ProjectionScratch<R> {
    pub fn new(client: &ComputeClient<R>, config: &ModelConfig, dtype: DType) -> Self {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let widest_in = h.max(i).max(config.q_dim());
        let widest_out = (2 * i).max(h).max(config.q_dim() + 2 * config.kv_dim());
        Self {
            linear: LinearWorkspace::new(client, 1, widest_in, widest_out, dtype),
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

    pub fn has_bias(&self) -> bool {
        match self {
            Self::Dense { bias, .. } => bias.is_some(),
            Self::Compressed { bias, .. } => bias.is_some(),
        }
    }

    /// Whether the decode step's launches for this projection allocate nothing, so that they
    /// can be captured in a CUDA graph: all but the sparse layer, whose kernel allocates its
    /// split-row partials per call (a replayed graph would keep writing to memory the pool has
    /// since handed to someone else). The quantized layers run from the step's scratch.
    pub fn graph_safe(&self) -> bool {
        match self {
            Self::Dense { .. } => true,
            Self::Compressed { layer, .. } => layer.graph_safe(),
        }
    }

    /// Device bytes of the weight (and bias, scales, indices).
    pub fn bytes(&self) -> usize {
        match self {
            Self::Dense { weight, bias } => {
                tensor_bytes(&weight.tensor) + bias.as_ref().map_or(0, |b| tensor_bytes(&b.tensor))
            }
            Self::Compressed { layer, bias, .. } => {
                layer.weight_bytes() + bias.as_ref().map_or(0, tensor_bytes)
            }
        }
    }

    fn out_features(&self) -> usize {
        match self {
            Self::Dense { weight, .. } => weight.tensor.shape()[0],
            Self::Compressed { layer, .. } => layer.out_rows(),
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
            Self::Compressed { layer, bias, .. } => {
                let epilogue = Epilogue::NONE.bias(bias.as_ref());
                let epilogue = match residual {
                    Some(r) => epilogue.residual(r),
                    None => epilogue,
                };
                let ws = scratch.map(|s| &s.linear);
                Ok(layer.forward_into(client, x, epilogue, out, ws)?)
            }
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
            Self::Compressed { layer, bias, .. } => {
                let epilogue = Epilogue::NONE.bias(bias.as_ref()).gated(Activation::Silu);
                layer.forward_into(client, x, epilogue, out, scratch.map(|s| &s.linear))?;
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
