//! The tensor-core GEMV's CUDA C++ for an sm_90 device, built on any machine
//! (`testkit::cuda_source`): the 1.5B model's projections as bf16 decodes them (down with its K
//! split across cubes, the LM head on two-tile planes) and a 16-row gated one must compile, with
//! no `mma` operand passed by address.

use cubecl::prelude::*;
use testkit::cuda_source;

use super::{tensor_gemv_kernel, TensorGemvBlueprint, TensorGemvShape, PLANE, VEC};
use crate::gemm::EpilogueBlueprint;
use crate::DType;

/// SMs of an sm_90 device as the CUDA runtime reports an H100 or H200.
const SM90_SMS: usize = 132;

/// Checks the CUDA C++ of the bf16 launch for `m` rows, `n` columns over `k` on an sm_90 device
/// with a split-K scratch at hand, expanded with `client`'s runtime (written as `name.cu` where
/// asked).
fn source<R: Runtime>(
    client: &ComputeClient<R>,
    name: &str,
    [m, k, n]: [usize; 3],
    epilogue: EpilogueBlueprint,
    norm: bool,
) {
    let shape = TensorGemvShape::auto(n, k, epilogue.is_gated(), SM90_SMS, true);
    let groups = shape.groups_per_cube();
    let plan = TensorGemvBlueprint {
        m: m as u32,
        splits: shape.splits,
        groups,
        vectors: shape.vectors,
        tiles: shape.tiles,
        cube_splits: shape.cube_splits,
        norm,
        epilogue,
        trigger: true,
        early_wait: true,
    };
    let elem = DType::BF16.elem_type();
    let (settings, mut launcher) = cuda_source::launcher(client, PLANE * shape.splits * groups);
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<tensor_gemv_kernel::_N>>(VEC);
        scope.register_type::<DynamicScalar<tensor_gemv_kernel::_F>>(elem);
    });
    use tensor_gemv_kernel::{F, N};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let w = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let w_up = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let bias = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let residual = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let out = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let norm_w = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let partials = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let counters = <[Atomic<u32>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (columns, K in vectors, the up rows' offset; 1 / K, eps) register their values;
    // their compilation argument is `()`.
    for v in [n, k / VEC, n] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    for v in [1.0 / k as f32, 1e-6] {
        <f32 as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = tensor_gemv_kernel::TensorGemvKernel::<R>::new(
        settings,
        client.clone(),
        x,
        w,
        w_up,
        bias,
        residual,
        out,
        norm_w,
        partials,
        counters,
        (),
        (),
        (),
        (),
        (),
        VEC,
        plan,
        elem,
    );
    cuda_source::check(name, kernel.define());
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    for (name, mkn, epilogue, norm) in super::super::decode_products() {
        source(
            client,
            &format!("tensor_gemv_bf16_{name}"),
            mkn,
            epilogue,
            norm,
        );
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
