//! A linear layer whose weight is block-sparse: the drop-in replacement for a dense
//! `y = x · Wᵀ + b` once `W` has been pruned (e.g. the MLP projections of a model loaded with a
//! sparsify option). Pruning trades accuracy for speed; the caller picks the ratio.

use cubecl::prelude::*;
use ops::{DType, DeviceTensor, Result};

use crate::{bsr_linear, bsr_linear_into, Bsr, SparseError};

/// `y = x · Wᵀ (+ bias)` with `W[out_features, in_features]` in BSR.
pub struct SparseLinear<R: Runtime> {
    pub weight: Bsr<R>,
    /// `[out_features]`, same dtype as the weight.
    pub bias: Option<DeviceTensor<R>>,
}

impl<R: Runtime> Clone for SparseLinear<R> {
    fn clone(&self) -> Self {
        Self {
            weight: self.weight.clone(),
            bias: self.bias.clone(),
        }
    }
}

impl<R: Runtime> SparseLinear<R> {
    /// Keeps the non-zero blocks of a dense host weight `[out, in]` (f32), with an optional
    /// host bias `[out]`.
    pub fn from_dense(
        client: &ComputeClient<R>,
        weight: &[f32],
        shape: [usize; 2],
        bias: Option<&[f32]>,
        block: usize,
        dtype: DType,
    ) -> std::result::Result<Self, SparseError> {
        let weight = Bsr::from_dense(client, weight, shape, block, dtype)?;
        Self::with_bias(client, weight, bias, dtype)
    }

    /// Prunes a dense host weight to `sparsity` (fraction of blocks dropped, by block L2 norm:
    /// see [`Bsr::prune_from_dense`]). This changes the layer's outputs: an accuracy trade-off.
    pub fn prune(
        client: &ComputeClient<R>,
        weight: &[f32],
        shape: [usize; 2],
        bias: Option<&[f32]>,
        block: usize,
        sparsity: f64,
        dtype: DType,
    ) -> std::result::Result<Self, SparseError> {
        let weight = Bsr::prune_from_dense(client, weight, shape, block, sparsity, dtype)?;
        Self::with_bias(client, weight, bias, dtype)
    }

    fn with_bias(
        client: &ComputeClient<R>,
        weight: Bsr<R>,
        bias: Option<&[f32]>,
        dtype: DType,
    ) -> std::result::Result<Self, SparseError> {
        let bias = match bias {
            Some(b) => Some(DeviceTensor::from_f32(
                client,
                b,
                &[weight.shape()[0]],
                dtype,
            )?),
            None => None,
        };
        Ok(Self { weight, bias })
    }

    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// `x[.., in] -> y[.., out]`.
    pub fn forward(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
    ) -> Result<DeviceTensor<R>> {
        bsr_linear(client, x, &self.weight, self.bias.as_ref())
    }

    /// [`Self::forward`] into a preallocated `out[.., out]`.
    pub fn forward_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        out: &DeviceTensor<R>,
    ) -> Result<()> {
        bsr_linear_into(client, x, &self.weight, self.bias.as_ref(), out)
    }
}
