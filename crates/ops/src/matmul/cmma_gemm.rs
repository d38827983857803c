//! Tensor-core GEMM (placeholder until written): reports unsupported so dispatch uses tiling.

use cubecl::prelude::*;

use super::Problem;
use crate::DeviceTensor;

pub(crate) fn supported<R: Runtime>(_client: &ComputeClient<R>, _dtype: crate::DType) -> bool {
    false
}

pub(crate) fn launch<R: Runtime>(
    _client: &ComputeClient<R>,
    _p: &Problem<'_, R>,
    _bias: &DeviceTensor<R>,
    _residual: &DeviceTensor<R>,
) {
    unreachable!("dispatch never picks the tensor-core GEMM while `supported` is false")
}
