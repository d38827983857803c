//! A linear layer whose weight is block-sparse: the drop-in replacement for a dense
//! `y = x · Wᵀ` once `W` has been pruned (e.g. the MLP projections of a model loaded with a
//! sparsify option). Pruning trades accuracy for speed; the caller picks the ratio.

use cubecl::prelude::*;
use ops::linear::{unfused_epilogue, Epilogue, Linear, LinearWorkspace};
use ops::{DType, DeviceTensor, Result};

use crate::{bsr_linear_into, Bsr, SparseError};

/// `y = x · Wᵀ` with `W[out_features, in_features]` in BSR; the bias comes with the
/// [`Epilogue`] and is added by the kernel, a residual or gated activation after it.
pub struct SparseLinear<R: Runtime> {
    pub weight: Bsr<R>,
}

impl<R: Runtime> Clone for SparseLinear<R> {
    fn clone(&self) -> Self {
        Self {
            weight: self.weight.clone(),
        }
    }
}

impl<R: Runtime> SparseLinear<R> {
    /// Keeps the non-zero blocks of a dense host weight `[out, in]` (f32).
    pub fn from_dense(
        client: &ComputeClient<R>,
        weight: &[f32],
        shape: [usize; 2],
        block: usize,
        dtype: DType,
    ) -> std::result::Result<Self, SparseError> {
        let weight = Bsr::from_dense(client, weight, shape, block, dtype)?;
        Ok(Self { weight })
    }

    /// Prunes a dense host weight to `sparsity` (fraction of blocks dropped, by block L2 norm:
    /// see [`Bsr::prune_from_dense`]). This changes the layer's outputs: an accuracy trade-off.
    pub fn prune(
        client: &ComputeClient<R>,
        weight: &[f32],
        shape: [usize; 2],
        block: usize,
        sparsity: f64,
        dtype: DType,
    ) -> std::result::Result<Self, SparseError> {
        let weight = Bsr::prune_from_dense(client, weight, shape, block, sparsity, dtype)?;
        Ok(Self { weight })
    }
}

impl<R: Runtime> Linear<R> for SparseLinear<R> {
    fn shape(&self) -> [usize; 2] {
        self.weight.shape()
    }

    fn forward_into(
        &self,
        client: &ComputeClient<R>,
        x: &DeviceTensor<R>,
        epilogue: Epilogue<'_, R>,
        out: &DeviceTensor<R>,
        workspace: Option<&LinearWorkspace<R>>,
    ) -> Result<()> {
        unfused_epilogue(
            client,
            "SparseLinear",
            epilogue,
            out,
            workspace,
            |dst, bias| bsr_linear_into(client, x, &self.weight, bias, dst),
        )
    }

    /// Device bytes of the block values and the index arrays.
    fn weight_bytes(&self) -> usize {
        let bytes = |t: &DeviceTensor<R>| t.numel() * t.dtype().size();
        let w = &self.weight;
        bytes(w.values()) + bytes(w.crow_indices()) + bytes(w.col_indices())
    }

    fn describe(&self) -> String {
        let w = &self.weight;
        format!(
            "block-sparse {}x{}, density {:.2}",
            w.block_size(),
            w.block_size(),
            w.density()
        )
    }

    /// The kernel allocates its split-row partials per call (a replayed graph would keep writing
    /// to memory the pool has since handed to someone else).
    fn graph_safe(&self) -> bool {
        false
    }
}
