//! The kernel's CUDA C++ for an sm_90 device (132 SMs, programmatic dependent launch, plane
//! reductions), built on any machine (`testkit::cuda_source`): each of the 1.5B model's four
//! projections in both formats, a 12-row gated one (two MMAs of x rows) and an awkward f16 one
//! must compile, with no `mma` operand passed by address.

use cubecl::prelude::*;
use ops::gemm::EpilogueBlueprint;
use ops::matmul::Activation;
use ops::DType;
use testkit::cuda_source;

use super::{float_x_kernel, launch_plan, Shape};
use crate::w4a16_mma::SmDevice;

/// Checks the CUDA C++ of the launch for `shape` on an sm_90 device with `dtype` activations,
/// expanded with `client`'s runtime (written as `name.cu` where asked).
fn source<R: Runtime>(client: &ComputeClient<R>, name: &str, shape: Shape, dtype: DType) {
    let (plan, units, _) = launch_plan(shape, SmDevice::SM90, cuda_source::sm90_reduce);
    let elem = dtype.elem_type();
    let (settings, mut launcher) = cuda_source::launcher(client, units);
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<float_x_kernel::_NX>>(8usize);
        scope.register_type::<DynamicScalar<float_x_kernel::_F>>(elem);
    });
    use float_x_kernel::{F, NX};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    let w = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let w_scale = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let bias = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let residual = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let out = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let norm_w = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (n, k, the weight's pitch in vectors, the up rows' offset, 1 / k, eps) register
    // their values; their compilation argument is `()`.
    for v in [shape.n, shape.k, shape.k.div_ceil(16), shape.n] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    for v in [1.0 / shape.k as f32, 1e-6] {
        <f32 as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = float_x_kernel::FloatXKernel::<R>::new(
        settings,
        client.clone(),
        x,
        w,
        w_scale,
        bias,
        residual,
        out,
        norm_w,
        (),
        (),
        (),
        (),
        (),
        (),
        8,
        plan,
        elem,
    );
    cuda_source::check(name, kernel.define());
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    let linear = EpilogueBlueprint::linear;
    let gated = EpilogueBlueprint::gated(Activation::Silu);
    for fp8 in [false, true] {
        let format = if fp8 { "fp8" } else { "int8" };
        for (name, m, k, n, epilogue, norm, dtype) in [
            ("qkv", 1, 1536, 2048, linear(true, false), true, DType::BF16),
            ("o", 1, 1536, 1536, linear(false, true), false, DType::BF16),
            ("gate_up", 1, 1536, 8960, gated, true, DType::BF16),
            (
                "down",
                1,
                8960,
                1536,
                linear(false, true),
                false,
                DType::BF16,
            ),
            ("gate_up_12rows", 12, 1536, 8960, gated, true, DType::BF16),
            (
                "awkward_f16",
                3,
                208,
                33,
                linear(true, true),
                false,
                DType::F16,
            ),
        ] {
            let shape = Shape {
                m,
                k,
                n,
                fp8,
                epilogue,
                norm,
            };
            source(client, &format!("float_x_{format}_{name}"), shape, dtype);
        }
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
