//! Which kernel a product runs on ([`plan`], or a forced [`MatmulStrategy`]) and how
//! ([`ProductOptions`]: the split-K scratch, row invariance), and what the decode products need of
//! a [`SplitScratch`] ([`scratch_need`]).

use cubecl::prelude::*;

use super::{cmma, mma_gemv, CmmaTile, TensorGemvShape, GEMV_MAX_M};
use crate::caps;
use crate::gemm::{SplitNeed, SplitScratch};

/// Which kernel a product runs on (exposed for benchmarks and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Gemv,
    /// The GEMV on tensor cores (`mma` m16n8k16; see [`TensorGemvShape`]).
    TensorGemv,
    TensorCore,
    Tiled,
}

/// The kernel `linear` picks for `m` rows of `dtype` with `k` inputs on this runtime. One row
/// runs on the CUDA-core GEMV, which streams a single row's weights fastest. From 2 to
/// [`GEMV_MAX_M`] rows, bf16 runs on the tensor-core GEMV where the runtime has `mma` m16n8k16
/// and K is a multiple of 8 (its cost barely grows with M); f16 stays on the CUDA-core GEMV,
/// whose fused input norm cannot overflow f16. Callers that need a row's result not to depend on
/// M (continuous batching) ask for [`ProductOptions::rows_invariant`], which plans every M as 16
/// rows ([`plan_rows_invariant`]).
pub fn plan<R: Runtime>(
    client: &ComputeClient<R>,
    m: usize,
    k: usize,
    dtype: crate::DType,
) -> Kernel {
    plan_with(client, m, k, dtype, false)
}

/// [`plan`] with every M up to [`GEMV_MAX_M`] planned as 16 rows: the kernel, and so the
/// rounding of a row, is the same whatever the number of rows.
pub fn plan_rows_invariant<R: Runtime>(
    client: &ComputeClient<R>,
    m: usize,
    k: usize,
    dtype: crate::DType,
) -> Kernel {
    plan_with(client, m, k, dtype, true)
}

pub(super) fn plan_with<R: Runtime>(
    client: &ComputeClient<R>,
    m: usize,
    k: usize,
    dtype: crate::DType,
    rows_invariant: bool,
) -> Kernel {
    if m <= GEMV_MAX_M {
        let tensor = dtype == crate::DType::BF16 && mma_gemv::supported(client, dtype, k);
        if tensor && (m > 1 || rows_invariant) {
            Kernel::TensorGemv
        } else {
            Kernel::Gemv
        }
    } else if cmma::supported(client, dtype) {
        Kernel::TensorCore
    } else {
        Kernel::Tiled
    }
}

/// Which kernel a product runs on: [`plan`]'s choice, or a forced one (tests, benchmarks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MatmulStrategy {
    /// What [`plan`] picks, with the tensor-core tile [`CmmaTile::auto`] picks.
    #[default]
    Auto,
    /// The GEMV at any M up to [`GEMV_MAX_M`] (`InvalidArgument` above).
    Gemv,
    /// The GEMV with K split over this many plane-sized groups of units per output column (1, 2,
    /// 4 or 8; `InvalidArgument` otherwise) instead of the count it picks from the shape.
    GemvSplit(u32),
    /// The tensor-core GEMV (f16/bf16) at any M up to [`GEMV_MAX_M`], with this shape or, for
    /// `None`, [`TensorGemvShape::auto`]'s: `UnsupportedFeature` where the runtime has no
    /// `mma` m16n8k16 of the dtype or K is not a multiple of 8, `InvalidArgument` above 16 rows
    /// or for a shape outside [`TensorGemvShape`]'s values.
    TensorGemv(Option<TensorGemvShape>),
    /// The portable shared-memory tiled GEMM, at any M.
    Tiled,
    /// The tensor-core GEMM with this tile, at any M: `UnsupportedFeature` where the runtime has
    /// no f16/bf16 16x16x16 `cmma` (see [`plan`]), `InvalidArgument` for a tile the kernel
    /// cannot run here (see [`CmmaTile::is_valid`]; for the gated MLP `bn` counts gate and up
    /// rows, so a tile covers `bn / 2` output columns). A tile with `stages >= 2` runs the
    /// register-staged path where `cp.async` cannot be used.
    TensorCore(CmmaTile),
}

/// How a product runs beyond its operands: the kernel, and the scratch that lets the decode
/// products split K across cubes ([`crate::gemm::split_k`]).
///
/// Without a scratch a tensor-core GEMV keeps each column group's K inside one cube (its planes
/// loop over what they do not cover at once), so `linear_into` and friends allocate nothing; with
/// one, long-K products such as the 1.5B model's `down` spread over more cubes. The two round
/// differently; a given call site always uses the same.
pub struct ProductOptions<'a, R: Runtime> {
    pub strategy: MatmulStrategy,
    /// Room for the split-K partial sums (see [`scratch_need`]); `None` keeps K in one cube.
    pub split_k: Option<&'a SplitScratch<R>>,
    /// Plan every M up to [`GEMV_MAX_M`] as 16 rows ([`plan_rows_invariant`]), so that a row's
    /// result does not depend on how many rows run with it (continuous batching).
    pub rows_invariant: bool,
}

impl<R: Runtime> Clone for ProductOptions<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for ProductOptions<'_, R> {}

impl<R: Runtime> Default for ProductOptions<'_, R> {
    fn default() -> Self {
        Self::from(MatmulStrategy::Auto)
    }
}

impl<R: Runtime> From<MatmulStrategy> for ProductOptions<'_, R> {
    fn from(strategy: MatmulStrategy) -> Self {
        Self {
            strategy,
            split_k: None,
            rows_invariant: false,
        }
    }
}

/// What products of up to 16 rows over a `[n_rows, k]` weight (any epilogue, gated or not,
/// normed or not) need of a [`SplitScratch`] on this runtime: nothing where the decode products
/// do not split K across cubes.
pub fn scratch_need<R: Runtime>(client: &ComputeClient<R>, n_rows: usize, k: usize) -> SplitNeed {
    if !mma_gemv::supported(client, crate::DType::BF16, k) {
        return SplitNeed::default();
    }
    mma_gemv::scratch_need(n_rows, k, caps::num_sms(client) as usize)
}
