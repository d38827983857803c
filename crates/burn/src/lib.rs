//! Burn modules for cubellm's linear layers: [`Linear`] (dense), [`W8A8Linear`], [`Fp8Linear`],
//! [`W4A16Linear`] (quantized) and [`SparseLinear`] (block-sparse), each a `burn_core`
//! [`Module`](burn_core::module::Module) whose `forward(Tensor<D>) -> Result<Tensor<D>>` runs our
//! kernel over the last dimension.
//!
//! **Burn 0.22.0-pre.3.** Its user-facing `Tensor<D>` has no backend parameter: it is a dispatch
//! tensor whose variant names the backend it lives on (`Wgpu`, `Cuda`, ...), and `Module` is not
//! generic over a backend either. The modules here are generic over the CubeCL runtime `R`
//! instead ([`BurnRuntime`]): a tensor must live on Burn's plain `CubeBackend<R>` of that runtime,
//! which is what the dispatch variants `Wgpu` and `Cuda` are when Burn's `fusion` feature is off
//! (it is a default feature of `burn-wgpu`/`burn-cuda`/`burn-dispatch`: depend on Burn with
//! `default-features = false`). A tensor of another backend (fusion, autodiff, ndarray, another
//! runtime) is an [`OpsError::InvalidArgument`], never a panic. [`tensor_from_data`] and
//! [`device`] make tensors and devices of `CubeBackend<R>` without naming the runtime.
//!
//! **Errors.** Construction and `forward` return [`OpsError`] (block-sparse errors convert into
//! it): a weight that is not a matrix, a bias of the wrong length, a dtype the runtime lacks
//! (bf16 on wgpu), an input whose last dimension is not the layer's `in_features`, operands on
//! different devices.
//!
//! **Records.** [`Linear`]'s state is two Burn parameters (`weight [N, K]`, `bias [N]`): it saves
//! and loads with `Module::into_record` / `load_record` (burnpack files or bytes). The quantized
//! and sparse modules record only their bias: their packed weights (int8/fp8/int4 codes and
//! scales, BSR blocks) live in our own device buffers, outside Burn's parameter tree, so a record
//! of them does not hold the weight. Rebuild them from a recorded dense [`Linear`] instead: the
//! quantization is deterministic, so the same dense weight gives the same layer.

mod compressed;
mod dense;

pub use compressed::{Fp8Linear, SparseLinear, W4A16Linear, W8A8Linear};
pub use dense::Linear;
pub use ops::OpsError;

use burn_backend::ops::FloatTensorOps;
use burn_backend::{TensorData, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use burn_dispatch::{DispatchKindConversion, DispatchTensor};
use burn_tensor::{Int, Tensor};

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, OpsError>;

/// A CubeCL runtime whose Burn `CubeBackend` is a variant of Burn's dispatch tensor (so that a
/// `Tensor<D>` can be unwrapped to the `CubeTensor<R>` our ops run on, and an output wrapped
/// back). Implemented for every runtime where that holds: `WgpuRuntime` and `CudaRuntime` once
/// Burn's `wgpu` / `cuda` features are on (and its `fusion` feature off).
pub trait BurnRuntime: CubeRuntime {
    /// The `CubeBackend<Self>` primitive of a float tensor; `op` names the caller in the error.
    fn float_primitive<const D: usize>(op: &'static str, t: Tensor<D>) -> Result<CubeTensor<Self>>;
    /// The `CubeBackend<Self>` primitive of an int tensor.
    fn int_primitive<const D: usize>(
        op: &'static str,
        t: Tensor<D, Int>,
    ) -> Result<CubeTensor<Self>>;
    /// A float primitive as a `Tensor<D>` (its rank must be `D`).
    fn float_tensor<const D: usize>(p: CubeTensor<Self>) -> Tensor<D>;
    /// An int primitive as a `Tensor<D, Int>` (its rank must be `D`).
    fn int_tensor<const D: usize>(p: CubeTensor<Self>) -> Tensor<D, Int>;
}

fn not_ours<R: CubeRuntime>(op: &'static str, e: impl std::fmt::Debug) -> OpsError {
    OpsError::invalid(
        op,
        format!(
            "the tensor is not a CubeBackend<{}> tensor (Burn's fusion or autodiff backends, or \
             another runtime, are not covered): {e:?}",
            std::any::type_name::<R>()
        ),
    )
}

impl<R> BurnRuntime for R
where
    R: CubeRuntime,
    DispatchTensor: DispatchKindConversion<CubeBackend<R>>,
{
    fn float_primitive<const D: usize>(op: &'static str, t: Tensor<D>) -> Result<CubeTensor<R>> {
        t.try_into_primitive::<CubeBackend<R>>()
            .map_err(|e| not_ours::<R>(op, e))
    }

    fn int_primitive<const D: usize>(op: &'static str, t: Tensor<D, Int>) -> Result<CubeTensor<R>> {
        t.try_into_primitive::<CubeBackend<R>>()
            .map_err(|e| not_ours::<R>(op, e))
    }

    fn float_tensor<const D: usize>(p: CubeTensor<R>) -> Tensor<D> {
        debug_assert_eq!(p.shape().num_dims(), D);
        Tensor::from_primitive::<CubeBackend<R>>(p)
    }

    fn int_tensor<const D: usize>(p: CubeTensor<R>) -> Tensor<D, Int> {
        debug_assert_eq!(p.shape().num_dims(), D);
        Tensor::from_primitive::<CubeBackend<R>>(p)
    }
}

/// A float tensor of `CubeBackend<R>` on `device` holding `data` (its dtype as given).
pub fn tensor_from_data<R: BurnRuntime, const D: usize>(
    data: TensorData,
    device: &R::Device,
) -> Result<Tensor<D>> {
    if data.shape.len() != D {
        return Err(OpsError::shape(
            "tensor_from_data",
            format!("data of shape {:?} for a tensor of rank {D}", data.shape),
        ));
    }
    Ok(R::float_tensor(CubeBackend::<R>::float_from_data(
        data, device,
    )))
}

/// Burn's device (the dispatch device) of `CubeBackend<R>` on `device`, for Burn's own tensor
/// constructors (`Tensor::from_data(.., &device)`, `Tensor::zeros`, ...).
pub fn device<R: BurnRuntime>(device: &R::Device) -> burn_tensor::Device {
    let probe: Tensor<1> = R::float_tensor(CubeBackend::<R>::float_from_data(
        TensorData::new(vec![0f32], [1]),
        device,
    ));
    probe.device()
}
