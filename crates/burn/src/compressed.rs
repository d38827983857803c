//! The quantized and block-sparse layers as Burn modules: each holds the layer of the `quant` or
//! `sparse` crate (built once from a dense `[N, K]` weight) and its bias as a Burn parameter.

use std::fmt;
use std::sync::Arc;

use burn_core as burn;
use burn_core::module::{Module, Param};
use burn_cubecl::tensor::CubeTensor;
use burn_tensor::Tensor;
use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear as _};
use ops::{DType, DeviceTensor};

use crate::{BurnRuntime, Linear, OpsError, Result};

/// A compressed layer kept outside Burn's parameter tree (a skipped field of the module): the
/// layer, the device its buffers live on, and its description for `Debug`.
struct Layer<R: BurnRuntime, L> {
    inner: Arc<L>,
    device: R::Device,
    describe: String,
}

impl<R: BurnRuntime, L> Clone for Layer<R, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            device: self.device.clone(),
            describe: self.describe.clone(),
        }
    }
}

impl<R: BurnRuntime, L> fmt::Debug for Layer<R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe)
    }
}

/// A dense weight read to the host for quantization: values (f32, rounded as the tensor holds
/// them), shape, dtype, and the client and device of the tensor.
struct HostWeight<R: BurnRuntime> {
    values: Vec<f32>,
    shape: [usize; 2],
    dtype: DType,
    client: ComputeClient<R>,
    device: R::Device,
}

fn host_weight<R: BurnRuntime>(
    op: &'static str,
    weight: Tensor<2>,
    bias: Option<&Tensor<1>>,
) -> Result<HostWeight<R>> {
    let shape = weight.dims();
    let p = R::float_primitive(op, weight)?;
    let (w, p) = ops::burn::to_device_tensor(op, p)?;
    if let Some(b) = bias {
        let bp = R::float_primitive(op, b.clone())?;
        let (bd, bp) = ops::burn::to_device_tensor(op, bp)?;
        if bd.shape() != [shape[0]] {
            return Err(OpsError::shape(
                op,
                format!("bias {:?} for a weight of {} rows", bd.shape(), shape[0]),
            ));
        }
        if bd.dtype() != w.dtype() {
            return Err(OpsError::invalid(
                op,
                format!(
                    "bias of dtype {}, weight of dtype {}",
                    bd.dtype(),
                    w.dtype()
                ),
            ));
        }
        if bp.device != p.device {
            return Err(OpsError::invalid(
                op,
                "the bias and the weight are on different devices",
            ));
        }
    }
    Ok(HostWeight {
        values: w.to_f32_vec(&p.client)?,
        shape,
        dtype: w.dtype(),
        client: p.client.clone(),
        device: p.device.clone(),
    })
}

/// `layer(x) (+ bias)` on Burn tensors: x made contiguous (a copy only if it is not), flattened
/// to `[rows, K]` for the layer, and the output given x's leading dimensions.
fn forward<R: BurnRuntime, L: ops::linear::Linear<R>, const D: usize>(
    op: &'static str,
    layer: &Layer<R, L>,
    bias: Option<&Param<Tensor<1>>>,
    x: Tensor<D>,
) -> Result<Tensor<D>> {
    let x: CubeTensor<R> = R::float_primitive(op, x)?;
    let (xd, x) = ops::burn::to_device_tensor(op, x)?;
    if x.device != layer.device {
        return Err(OpsError::invalid(
            op,
            format!(
                "x is on {:?}, the layer's weight on {:?}",
                x.device, layer.device
            ),
        ));
    }
    let [n, k] = layer.inner.shape();
    if xd.rank() == 0 || xd.last_dim() != k || xd.numel() == 0 {
        return Err(OpsError::shape(
            op,
            format!("x {:?} for a layer of in_features {k}", xd.shape()),
        ));
    }
    let bias = match bias {
        Some(b) => {
            let bp = R::float_primitive(op, b.val())?;
            if bp.device != x.device {
                return Err(OpsError::invalid(op, "x and the bias on different devices"));
            }
            Some(ops::burn::to_device_tensor(op, bp)?.0)
        }
        None => None,
    };
    let rows = xd.numel() / k;
    let flat = xd.reshape(&[rows, k])?;
    let out: DeviceTensor<R> =
        layer
            .inner
            .forward(&x.client, &flat, Epilogue::NONE.bias(bias.as_ref()))?;
    let mut shape = xd.shape().to_vec();
    *shape.last_mut().expect("rank checked above") = n;
    let out = out.reshape(&shape)?;
    Ok(R::float_tensor(ops::burn::from_device_tensor(out, &x)))
}

macro_rules! compressed_module {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        #[derive(Module, Debug)]
        pub struct $name<R: BurnRuntime> {
            /// `[out_features]`, in the activation dtype: recorded by Burn's recorders (the
            /// weight is not; see the crate docs).
            pub bias: Option<Param<Tensor<1>>>,
            #[module(skip)]
            layer: Layer<R, $inner>,
        }

        impl<R: BurnRuntime> $name<R> {
            fn wrap(layer: $inner, device: R::Device, bias: Option<Tensor<1>>) -> Self {
                let describe = format!(
                    "{} [{}, {}]",
                    layer.describe(),
                    layer.shape()[0],
                    layer.shape()[1]
                );
                Self {
                    bias: bias.map(Param::from_tensor),
                    layer: Layer {
                        inner: Arc::new(layer),
                        device,
                        describe,
                    },
                }
            }

            /// `[out_features, in_features]` of the logical weight.
            pub fn shape(&self) -> [usize; 2] {
                self.layer.inner.shape()
            }

            /// Device bytes of the packed weight and what the format keeps beside it.
            pub fn weight_bytes(&self) -> usize {
                self.layer.inner.weight_bytes()
            }

            /// The format, e.g. for a load report.
            pub fn describe(&self) -> &str {
                &self.layer.describe
            }

            /// The underlying layer of the `quant` / `sparse` crate (for `ops::linear::Linear`
            /// calls on `DeviceTensor`s).
            pub fn layer(&self) -> &$inner {
                &self.layer.inner
            }

            /// `x[.., K] · Wᵀ (+ bias)`: `[.., N]` in x's dtype, which must be the activation
            /// dtype the layer was built for (the dense weight's). A non-contiguous `x` is
            /// copied to contiguous first.
            pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Result<Tensor<D>> {
                forward(
                    concat!("burn ", stringify!($name), "::forward"),
                    &self.layer,
                    self.bias.as_ref(),
                    x,
                )
            }
        }
    };
}

compressed_module!(
    /// int8 weights per output channel and int8 activations per token, i32 accumulation
    /// ([`quant::W8A8Linear`]).
    W8A8Linear,
    quant::W8A8Linear<R>
);
compressed_module!(
    /// fp8 (e4m3) weights per output channel and fp8 activations per token, f32 accumulation
    /// ([`quant::Fp8Linear`]).
    Fp8Linear,
    quant::Fp8Linear<R>
);
compressed_module!(
    /// int4 weights (per output channel or per group of input features) with float
    /// activations ([`quant::W4A16Linear`]).
    W4A16Linear,
    quant::W4A16Linear<R>
);
compressed_module!(
    /// A block-sparse weight (PyTorch's BSR layout) times dense activations
    /// ([`sparse::SparseLinear`]).
    SparseLinear,
    sparse::SparseLinear<R>
);

impl<R: BurnRuntime> W8A8Linear<R> {
    /// Quantizes `weight [N, K]` (a float tensor of `CubeBackend<R>`; its dtype becomes the
    /// activation dtype) and keeps `bias [N]` (same dtype) as a parameter.
    pub fn from_dense(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Result<Self> {
        const OP: &str = "burn W8A8Linear::from_dense";
        let w = host_weight::<R>(OP, weight, bias.as_ref())?;
        let layer = quant::W8A8Linear::from_dense(&w.client, &w.values, w.shape, w.dtype)?;
        Ok(Self::wrap(layer, w.device, bias))
    }

    /// [`Self::from_dense`] of a dense module's weight and bias.
    pub fn from_linear(linear: &Linear<R>) -> Result<Self> {
        Self::from_dense(linear.weight.val(), linear.bias.as_ref().map(|b| b.val()))
    }
}

impl<R: BurnRuntime> Fp8Linear<R> {
    /// Quantizes `weight [N, K]` to e4m3 (see [`W8A8Linear::from_dense`]).
    pub fn from_dense(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Result<Self> {
        const OP: &str = "burn Fp8Linear::from_dense";
        let w = host_weight::<R>(OP, weight, bias.as_ref())?;
        let layer = quant::Fp8Linear::from_dense(&w.client, &w.values, w.shape, w.dtype)?;
        Ok(Self::wrap(layer, w.device, bias))
    }

    /// [`Self::from_dense`] of a dense module's weight and bias.
    pub fn from_linear(linear: &Linear<R>) -> Result<Self> {
        Self::from_dense(linear.weight.val(), linear.bias.as_ref().map(|b| b.val()))
    }
}

impl<R: BurnRuntime> W4A16Linear<R> {
    /// Quantizes `weight [N, K]` to int4 with one scale per `group_size` input features
    /// (`None`: per output channel). K must be a multiple of 8 and of the group size.
    pub fn from_dense(
        weight: Tensor<2>,
        bias: Option<Tensor<1>>,
        group_size: Option<usize>,
    ) -> Result<Self> {
        const OP: &str = "burn W4A16Linear::from_dense";
        let w = host_weight::<R>(OP, weight, bias.as_ref())?;
        let layer =
            quant::W4A16Linear::from_dense(&w.client, &w.values, w.shape, w.dtype, group_size)?;
        Ok(Self::wrap(layer, w.device, bias))
    }

    /// [`Self::from_dense`] of a dense module's weight and bias.
    pub fn from_linear(linear: &Linear<R>, group_size: Option<usize>) -> Result<Self> {
        Self::from_dense(
            linear.weight.val(),
            linear.bias.as_ref().map(|b| b.val()),
            group_size,
        )
    }
}

impl<R: BurnRuntime> SparseLinear<R> {
    /// `weight [N, K]` in BSR with `block x block` blocks (N and K multiples of `block`, one of
    /// [`sparse::SUPPORTED_BLOCKS`]). `sparsity` 0 keeps every block that holds a non-zero
    /// (exactly the dense product); above, that fraction of the blocks with the smallest L2
    /// norms is dropped (an accuracy-for-speed trade: the output changes).
    pub fn from_dense(
        weight: Tensor<2>,
        bias: Option<Tensor<1>>,
        block: usize,
        sparsity: f64,
    ) -> Result<Self> {
        const OP: &str = "burn SparseLinear::from_dense";
        let w = host_weight::<R>(OP, weight, bias.as_ref())?;
        let layer = if sparsity == 0.0 {
            sparse::SparseLinear::from_dense(&w.client, &w.values, w.shape, block, w.dtype)?
        } else {
            sparse::SparseLinear::prune(&w.client, &w.values, w.shape, block, sparsity, w.dtype)?
        };
        Ok(Self::wrap(layer, w.device, bias))
    }

    /// [`Self::from_dense`] of a dense module's weight and bias.
    pub fn from_linear(linear: &Linear<R>, block: usize, sparsity: f64) -> Result<Self> {
        Self::from_dense(
            linear.weight.val(),
            linear.bias.as_ref().map(|b| b.val()),
            block,
            sparsity,
        )
    }
}
