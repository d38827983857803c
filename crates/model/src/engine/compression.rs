//! How the linear projections are stored on the device: dense in the compute dtype, or
//! compressed at load ([`Compression`]): block-sparse MLP weights (an accuracy trade-off the
//! caller asks for) or quantized projections (W8A8, FP8, W4A16), each a
//! `Box<dyn ops::linear::Linear<R>>` with its bias. Compressed projections are read to the
//! host in f32 and converted one at a time.

use cubecl::prelude::*;
use ops::{DType, DeviceTensor};

use crate::error::{ModelError, Result};
use crate::models::decoder::{Role, RoleKind};

/// Which projections of the model [`Compression`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Attention,
    Mlp,
    LmHead,
}

impl Slot {
    /// The slot of a layer tensor (`None`: norms, always dense).
    pub(crate) fn of(role: Role) -> Option<Self> {
        match role.kind() {
            RoleKind::Norm => None,
            RoleKind::Attention => Some(Self::Attention),
            RoleKind::Mlp => Some(Self::Mlp),
        }
    }
}

/// How the linear projections are stored on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Compression {
    /// Dense, in the compute dtype (the fused kernels).
    #[default]
    None,
    /// Prune the MLP weights (gate, up, down) to this fraction of zero blocks (by block L2
    /// norm, 32x32 blocks where the shapes allow, else 16x16) and run them block-sparse. This
    /// changes the model's outputs: an accuracy-for-speed trade-off.
    Sparsify { sparsity: f64 },
    /// Quantize every linear projection (q/k/v, o, gate/up, down; not the embeddings or the
    /// norms) at load, and the LM head too when `lm_head` is set (a tied head gets its own
    /// quantized copy; the embedding table stays float).
    Quant {
        mode: QuantMode,
        lm_head: bool,
        /// How the 8-bit formats multiply at decode (ignored by W4A16).
        decode: Decode8,
    },
}

/// How the 8-bit formats (W8A8, FP8) multiply at decode sizes (up to 16 rows on CUDA); prefill
/// always quantizes the activation and runs the 8-bit tensor-core GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Decode8 {
    /// [`Decode8::FloatSimt`] where that kernel runs (hidden and intermediate sizes multiples
    /// of 16), else [`Decode8::Codes`]; without a notice. On an H100 the 1.5B model decoded one
    /// sequence fastest that way (one call, two alternating rounds: W8A8 932 and 934 tok/s
    /// against 844 and 846 on the tensor-core float path and 832 and 834 on codes; FP8 950 and
    /// 950 against 842 and 839, and 764 and 765) and tracked the float model as closely as the
    /// tensor-core float path; on the software Vulkan device the demo model's W8A8 decode ran
    /// 1.8x faster than on codes (the portable codes GEMM is a 64x64 tile kernel).
    #[default]
    Auto,
    /// Quantize the activation per row and multiply 8-bit codes (the arithmetic of prefill).
    Codes,
    /// Multiply the 8-bit weights with the float activation on f16 tensor cores, without
    /// quantizing it (`quant::KernelChoice::FloatActivations`): no quantize pass before the
    /// products, x rounded to f16 instead of to 8 bits. Elsewhere (other runtimes, f32) as
    /// `Codes`, with a notice at load.
    Float,
    /// Multiply the 8-bit weights, decoded to f32 in registers, with the float activation in
    /// f32 on the SIMT cores (`quant::KernelChoice::FloatActivationsSimt`), as the bf16 GEMV
    /// multiplies bf16 weights: no quantize pass, x not rounded; on every runtime and float
    /// dtype (hidden and intermediate sizes multiples of 16, else as `Codes` with a notice).
    FloatSimt,
}

impl Decode8 {
    /// The 8-bit layers' kernel choice (a choice whose kernel does not run for a product runs the
    /// codes path).
    fn kernel(self) -> quant::KernelChoice {
        match self {
            Self::Codes => quant::KernelChoice::Auto,
            Self::Float => quant::KernelChoice::FloatActivations,
            Self::Auto | Self::FloatSimt => quant::KernelChoice::FloatActivationsSimt,
        }
    }
}

/// The quantized weight formats of [`Compression::Quant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// int8 weights per output channel, int8 activations per token, i32 accumulation.
    W8A8,
    /// fp8 e4m3 weights and activations with the same scaling, f32 accumulation.
    Fp8,
    /// int4 weights with float activations (dequantized in registers).
    W4A16 { group: Int4Group },
}

/// Where the scales of int4 weights change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Int4Group {
    /// Per group of 128 input features where K allows, else 64, else 32, else per channel
    /// (group-wise because per-channel int4 loses too much on real models).
    #[default]
    Auto,
    /// One scale per output channel.
    PerChannel,
    /// Groups of this many input features (K must be a multiple).
    Size(usize),
}

impl Int4Group {
    /// The group size for an input dimension `k` (`None`: per channel).
    fn for_k(self, k: usize) -> Option<usize> {
        match self {
            Self::Auto => [128, 64, 32].into_iter().find(|g| k.is_multiple_of(*g)),
            Self::PerChannel => None,
            Self::Size(g) => Some(g),
        }
    }
}

impl QuantMode {
    pub fn name(self) -> String {
        match self {
            Self::W8A8 => "w8a8".into(),
            Self::Fp8 => "fp8".into(),
            Self::W4A16 { group } => match group {
                Int4Group::Auto => "w4a16 (group 128 where K allows)".into(),
                Int4Group::PerChannel => "w4a16 (per channel)".into(),
                Int4Group::Size(g) => format!("w4a16 (group {g})"),
            },
        }
    }
}

impl Compression {
    pub(crate) fn applies_to(&self, slot: Slot) -> bool {
        match self {
            Self::None => false,
            Self::Sparsify { .. } => slot == Slot::Mlp,
            Self::Quant { lm_head, .. } => slot != Slot::LmHead || *lm_head,
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        match *self {
            Self::None | Self::Quant { .. } => Ok(()),
            Self::Sparsify { sparsity } if (0.0..1.0).contains(&sparsity) => Ok(()),
            Self::Sparsify { sparsity } => Err(ModelError::param(
                "sparsify",
                format!("the block sparsity must be in [0, 1), got {sparsity}"),
            )),
        }
    }

    /// A note for the user when the 8-bit formats were explicitly asked to decode on the float
    /// activation ([`Decode8::Float`], [`Decode8::FloatSimt`]) where that kernel does not run
    /// (one decode row of the hidden size, in `dtype`): they then decode on quantized
    /// activations.
    pub(crate) fn decode_notice<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        dtype: DType,
        hidden: usize,
    ) -> Option<String> {
        let Self::Quant { mode, decode, .. } = *self else {
            return None;
        };
        let needs = match decode {
            Decode8::Float => {
                "CUDA with the f16 tensor cores (sm_89+ for fp8) and bf16 or f16 activations"
            }
            Decode8::FloatSimt => "a hidden size that is a multiple of 16",
            Decode8::Auto | Decode8::Codes => return None,
        };
        let format = match mode {
            QuantMode::W8A8 => quant::QuantFormat::Int8,
            QuantMode::Fp8 => quant::QuantFormat::Fp8E4M3,
            QuantMode::W4A16 { .. } => return None,
        };
        let choice = decode.kernel();
        (!quant::gemm8::runs_float_activations(client, choice, format, dtype, 1, hidden)).then(
            || {
                format!(
                    "note: decoding {} on the float activation needs {needs} ({dtype}, hidden \
                     size {hidden}, on {} here): it decodes on quantized activations",
                    mode.name(),
                    ops::caps::runtime_name(client)
                )
            },
        )
    }

    /// Device bytes of a `numel`-element projection of a slot this compression applies to (the
    /// packed weights; scales and indices add a few percent).
    pub(crate) fn stored_bytes(&self, numel: u64, dtype: DType) -> u64 {
        match *self {
            Self::None => numel * dtype.size() as u64,
            Self::Sparsify { sparsity } => {
                (numel as f64 * dtype.size() as f64 * (1.0 - sparsity)).ceil() as u64
            }
            Self::Quant { mode, .. } => match mode {
                QuantMode::W8A8 | QuantMode::Fp8 => numel,
                QuantMode::W4A16 { .. } => numel.div_ceil(2),
            },
        }
    }

    /// Builds the compressed layer of a host weight `[n, k]` (f32) and its optional bias.
    pub(crate) fn build<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        w: &HostWeight,
        bias: Option<&HostWeight>,
        dtype: DType,
    ) -> Result<BuiltLayer<R>> {
        let [n, k] = w.shape[..] else {
            unreachable!("projections are matrices (checked by plan_weights)")
        };
        let bias = match bias {
            Some(b) => Some(DeviceTensor::from_f32(client, &b.data, &[n], dtype)?),
            None => None,
        };
        let layer: Box<dyn ops::linear::Linear<R>> = match *self {
            Self::None => unreachable!("dense projections are not built here"),
            Self::Sparsify { sparsity } => {
                let block = [32, 16]
                    .into_iter()
                    .find(|b| n % b == 0 && k % b == 0)
                    .ok_or_else(|| {
                        ModelError::param(
                            "sparsify",
                            format!(
                                "{} is [{n}, {k}]: block sparsity needs both dimensions to be \
                                 multiples of 16",
                                w.parts.join(" + ")
                            ),
                        )
                    })?;
                Box::new(sparse::SparseLinear::prune(
                    client,
                    &w.data,
                    [n, k],
                    block,
                    sparsity,
                    dtype,
                )?)
            }
            Self::Quant { mode, decode, .. } => match mode {
                QuantMode::W8A8 => Box::new(
                    quant::W8A8Linear::from_dense(client, &w.data, [n, k], dtype)?
                        .with_kernel(decode.kernel()),
                ),
                QuantMode::Fp8 => Box::new(
                    quant::Fp8Linear::from_dense(client, &w.data, [n, k], dtype)?
                        .with_kernel(decode.kernel()),
                ),
                QuantMode::W4A16 { group } => Box::new(quant::W4A16Linear::from_dense(
                    client,
                    &w.data,
                    [n, k],
                    dtype,
                    group.for_k(k),
                )?),
            },
        };
        Ok((layer, bias))
    }
}

/// A compressed layer and its bias.
pub(crate) type BuiltLayer<R> = (Box<dyn ops::linear::Linear<R>>, Option<DeviceTensor<R>>);

/// A checkpoint tensor (or fused group) read to the host in f32, to be compressed.
pub(crate) struct HostWeight {
    pub parts: Vec<String>,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}
