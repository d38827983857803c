//! The SIMT GEMV's CUDA C++ for an sm_90 device, built on any machine (`testkit::cuda_source`):
//! the 1.5B model's projections and LM head as single-sequence bf16 decode runs them (this
//! kernel, not the tensor-core GEMV, at one row) and a 16-row gated one must compile; the same
//! projections in f32, as the f32 models decode, too (ptxas schedules each dtype's loads apart:
//! only the f32 qkv once loaded x above its wait).

use cubecl::prelude::*;
use testkit::cuda_source;

use super::{gemv_kernel, launch_plan, GemvDevice};
use crate::gemm::EpilogueBlueprint;
use crate::DType;

/// An H100 or H200 as the CUDA runtime reports it: 132 SMs, 32-lane planes, programmatic
/// dependent launch.
const SM90: GemvDevice = GemvDevice {
    sms: 132,
    lanes: 32,
    use_plane: true,
    trigger: true,
    early_wait: true,
};
/// Checks the CUDA C++ of the `dtype` launch for `m` rows, `n` columns over `k` on an sm_90
/// device with programmatic dependent launch, expanded with `client`'s runtime (written as
/// `name.cu` where asked).
fn source<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    name: &str,
    [m, k, n]: [usize; 3],
    epilogue: EpilogueBlueprint,
    norm: bool,
) {
    // Elements per 16-byte vector.
    let vec = 16 / dtype.size();
    let k_vectors = k / vec;
    let (plan, cube_dim, _) = launch_plan([m, n, k_vectors], None, norm, epilogue, SM90);
    let elem = dtype.elem_type();
    let (settings, mut launcher) = cuda_source::launcher_of(client, cube_dim);
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<gemv_kernel::_N>>(vec);
        scope.register_type::<DynamicScalar<gemv_kernel::_F>>(elem);
    });
    use gemv_kernel::{F, N};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let w = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let w_up = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let bias = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let residual = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let out = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let norm_w = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (columns, K in vectors, the up rows' offset; 1 / K, eps) register their values;
    // their compilation argument is `()`.
    for v in [n, k_vectors, n] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    for v in [1.0 / k as f32, 1e-6] {
        <f32 as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = gemv_kernel::GemvKernel::<R>::new(
        settings,
        client.clone(),
        x,
        w,
        w_up,
        bias,
        residual,
        out,
        norm_w,
        (),
        (),
        (),
        (),
        (),
        vec,
        plan,
        elem,
    );
    cuda_source::check(name, kernel.define());
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    for (name, mkn, epilogue, norm) in super::super::decode_products() {
        // f32 at one row only: the f32 models decode one sequence at a time here.
        let dtypes: &[(DType, &str)] = if mkn[0] == 1 {
            &[(DType::BF16, "bf16"), (DType::F32, "f32")]
        } else {
            &[(DType::BF16, "bf16")]
        };
        for &(dtype, label) in dtypes {
            let name = format!("gemv_{label}_{name}");
            source(client, dtype, &name, mkn, epilogue, norm);
        }
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
