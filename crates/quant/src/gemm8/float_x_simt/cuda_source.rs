//! The kernel's CUDA C++ for an sm_90 device (132 SMs, programmatic dependent launch, plane
//! reductions, the e4m3 pair conversion), built on any machine (`testkit::cuda_source`): the
//! 1.5B model's four projections in both formats, a 16-row gated one, a 2-row down (two
//! columns per group) and an awkward f32 one must compile.

use cubecl::prelude::*;
use ops::gemm::EpilogueBlueprint;
use ops::matmul::Activation;
use ops::DType;
use testkit::cuda_source;

use super::{float_x_simt_kernel, launch_plan, Shape, SimtDevice, CODES};

/// Checks the CUDA C++ of the launch for `shape` on an sm_90 device with `dtype` activations,
/// expanded with `client`'s runtime (written as `name.cu` where asked).
fn source<R: Runtime>(client: &ComputeClient<R>, name: &str, shape: Shape, dtype: DType) {
    let (plan, cube_dim, _) = launch_plan(shape, SimtDevice::SM90);
    let elem = dtype.elem_type();
    let (settings, mut launcher) = cuda_source::launcher_of(client, cube_dim);
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<float_x_simt_kernel::_N>>(shape.vector);
        scope.register_type::<DynamicScalar<float_x_simt_kernel::_F>>(elem);
    });
    use float_x_simt_kernel::{F, N};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let w = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let w_scale = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let bias = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let residual = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let out = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let norm_w = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (n, the weight vectors per row of K and per padded row, the up rows' offset,
    // 1 / k, eps) register their values; their compilation argument is `()`.
    let vectors = shape.k / CODES;
    for v in [shape.n, vectors, vectors, shape.n] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    for v in [1.0 / shape.k as f32, 1e-6] {
        <f32 as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = float_x_simt_kernel::FloatXSimtKernel::<R>::new(
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
        shape.vector,
        plan,
        elem,
    );
    cuda_source::check(name, kernel.define());
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    let linear = EpilogueBlueprint::linear;
    let gated = EpilogueBlueprint::gated(Activation::Silu);
    let (bf16, f32) = (DType::BF16, DType::F32);
    for fp8 in [false, true] {
        let format = if fp8 { "fp8" } else { "int8" };
        for (name, m, k, n, epilogue, norm, dtype) in [
            ("qkv", 1, 1536, 2048, linear(true, false), true, bf16),
            ("o", 1, 1536, 1536, linear(false, true), false, bf16),
            ("gate_up", 1, 1536, 8960, gated, true, bf16),
            ("down", 1, 8960, 1536, linear(false, true), false, bf16),
            ("gate_up_16rows", 16, 1536, 8960, gated, true, bf16),
            (
                "down_2rows",
                2,
                8960,
                1536,
                linear(false, true),
                false,
                bf16,
            ),
            ("awkward_f32", 3, 208, 33, linear(true, true), true, f32),
        ] {
            let shape = Shape {
                m,
                k,
                n,
                fp8,
                norm,
                epilogue,
                vector: 16 / dtype.size(),
            };
            source(
                client,
                &format!("float_x_simt_{format}_{name}"),
                shape,
                dtype,
            );
        }
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
