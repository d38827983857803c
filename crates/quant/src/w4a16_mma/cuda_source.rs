//! The int4 GEMV's CUDA C++ for an sm_90 device, built on any machine (`testkit::cuda_source`):
//! the 1.5B model's projections as W4A16 decodes them (gate-up on the persistent launch), its
//! int4 LM head, down at 16 rows (x staged in chunks) and an f16 gate-up must compile, with no
//! `mma` operand passed by address.

use cubecl::prelude::*;
use ops::gemm::EpilogueBlueprint;
use ops::matmul::Activation;
use testkit::cuda_source;

use super::{launch_plan, w4a16_mma_kernel, SmDevice};

/// Checks the CUDA C++ of the launch for `[m, k, n]` on an sm_90 device (f16 activations, else
/// bf16), expanded with `client`'s runtime (written as `name.cu` where asked).
fn source<R: Runtime>(
    client: &ComputeClient<R>,
    name: &str,
    mkn: [usize; 3],
    f16: bool,
    epilogue: EpilogueBlueprint,
    norm: bool,
) {
    let device = SmDevice::SM90;
    let (plan, units, _, _) =
        launch_plan(mkn, f16, epilogue, norm, device, cuda_source::sm90_reduce);
    let elem = if f16 {
        ops::DType::F16
    } else {
        ops::DType::BF16
    }
    .elem_type();
    let (settings, mut launcher) = cuda_source::launcher(client, units);
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<w4a16_mma_kernel::_NX>>(8usize);
        scope.register_type::<DynamicScalar<w4a16_mma_kernel::_F>>(elem);
    });
    use w4a16_mma_kernel::{F, NX};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    let qweight = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let scales = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let bias = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let residual = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let out = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let norm_w = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (n, k, tile groups, steps, groups, steps per group, the up rows' offset; 1 / k,
    // eps) register their values; their compilation argument is `()`.
    let [_, k, n] = mkn;
    for v in [n, k, 1, k / 128, 1, k / 128, n] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    for v in [1.0 / k as f32, 1e-6] {
        <f32 as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = w4a16_mma_kernel::W4a16MmaKernel::<R>::new(
        settings,
        client.clone(),
        x,
        qweight,
        scales,
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
    for (name, mkn, f16, epilogue, norm) in [
        ("qkv", [1, 1536, 2048], false, linear(true, false), true),
        ("o", [1, 1536, 1536], false, linear(false, true), false),
        ("gate_up", [1, 1536, 8960], false, gated, true),
        ("down", [1, 8960, 1536], false, linear(false, true), false),
        (
            "lm_head",
            [1, 1536, 151_936],
            false,
            linear(false, false),
            false,
        ),
        (
            "down_16rows",
            [16, 8960, 1536],
            false,
            linear(false, true),
            false,
        ),
        ("gate_up_f16", [1, 1536, 8960], true, gated, true),
    ] {
        source(client, &format!("w4a16_{name}"), mkn, f16, epilogue, norm);
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
