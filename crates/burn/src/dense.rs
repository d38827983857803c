//! [`Linear`]: the dense layer, `y = x · Wᵀ (+ b)` with cubellm's GEMM/GEMV.

use std::marker::PhantomData;

use burn_backend::TensorMetadata;
use burn_core as burn;
use burn_core::module::{Module, Param};
use burn_tensor::Tensor;

use crate::{BurnRuntime, OpsError, Result};

/// A dense linear layer: `y = x · weightᵀ (+ bias)` over the last dimension of `x`, run by
/// [`ops::burn::linear`] (the bias in the product's epilogue, f32 accumulation).
///
/// `weight` is `[out_features, in_features]`, PyTorch's layout (the one checkpoints hold and the
/// kernel reads in place; Burn's `nn::Linear` keeps `[in, out]`: [`Linear::from_in_out`] takes
/// that one). Both parameters are ordinary Burn parameters: the module saves and loads with
/// Burn's records.
#[derive(Module, Debug)]
pub struct Linear<R: BurnRuntime> {
    /// `[out_features, in_features]`.
    pub weight: Param<Tensor<2>>,
    /// `[out_features]`.
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    runtime: PhantomData<R>,
}

impl<R: BurnRuntime> Linear<R> {
    /// The layer of `weight [N, K]` and an optional `bias [N]`, float tensors of one dtype on
    /// `CubeBackend<R>` (checked here: a wrong shape, dtype or backend is an error now rather
    /// than at the first forward).
    pub fn new(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Result<Self> {
        const OP: &str = "burn Linear::new";
        let w = R::float_primitive(OP, weight.clone())?;
        let wdtype = ops::burn::to_device_tensor(OP, w.clone())?.0.dtype();
        let [n, _k] = weight.dims();
        if let Some(b) = &bias {
            let bp = R::float_primitive(OP, b.clone())?;
            if b.dims() != [n] {
                return Err(OpsError::shape(
                    OP,
                    format!("bias {:?} for a weight of {n} rows", b.dims()),
                ));
            }
            if bp.dtype() != w.dtype() {
                return Err(OpsError::invalid(
                    OP,
                    format!("bias of dtype {:?}, weight of dtype {wdtype}", bp.dtype()),
                ));
            }
            if bp.device != w.device {
                return Err(OpsError::invalid(
                    OP,
                    "the bias and the weight are on different devices",
                ));
            }
        }
        Ok(Self {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            runtime: PhantomData,
        })
    }

    /// The layer of a weight in Burn's `nn::Linear` layout, `[in_features, out_features]`
    /// (transposed once into a contiguous `[out, in]` copy here, not on every call).
    pub fn from_in_out(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Result<Self> {
        const OP: &str = "burn Linear::from_in_out";
        let w = R::float_primitive(OP, weight.transpose())?;
        let (wd, w) = ops::burn::to_device_tensor(OP, w)?;
        let w = ops::burn::from_device_tensor(wd, &w);
        Self::new(R::float_tensor(w), bias)
    }

    /// `[out_features, in_features]`.
    pub fn shape(&self) -> [usize; 2] {
        self.weight.shape().dims()
    }

    /// `x[.., K] · weightᵀ (+ bias)`: `[.., N]` in x's dtype (which must be the weight's). A
    /// non-contiguous `x` is copied to contiguous first.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Result<Tensor<D>> {
        self.run(x, None)
    }

    /// [`Self::forward`] plus `residual [.., N]`, added in the product's epilogue (the
    /// transformer block's `h + o_proj(attn)`).
    pub fn forward_residual<const D: usize>(
        &self,
        x: Tensor<D>,
        residual: Tensor<D>,
    ) -> Result<Tensor<D>> {
        self.run(x, Some(residual))
    }

    fn run<const D: usize>(&self, x: Tensor<D>, residual: Option<Tensor<D>>) -> Result<Tensor<D>> {
        const OP: &str = "burn Linear::forward";
        let x = R::float_primitive(OP, x)?;
        let w = R::float_primitive(OP, self.weight.val())?;
        let b = match &self.bias {
            Some(b) => Some(R::float_primitive(OP, b.val())?),
            None => None,
        };
        let r = match residual {
            Some(r) => Some(R::float_primitive(OP, r)?),
            None => None,
        };
        Ok(R::float_tensor(ops::burn::linear(x, w, b, r)?))
    }
}
