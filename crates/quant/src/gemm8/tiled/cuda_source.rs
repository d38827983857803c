//! The 8-bit tile GEMM's CUDA C++ for an sm_90 device, built on any machine
//! (`testkit::cuda_source`): the 1.5B model's prefill products at a 512-token prompt as W8A8 and
//! FP8 run them (o with its K split and residual, gate-up without a split) and the split's sum
//! must compile, with no `mma` operand passed by address.

use cubecl::prelude::*;
use ops::DType;
use testkit::cuda_source;

use super::super::epilogue::{EpiloguePlan, Gemm8Out, Gemm8OutLaunch};
use super::{gemm8_mma_kernel, gemm8_split_sum_kernel};

/// The registered `Gemm8Out` of a bf16 `[m, k] x [n, k]` product.
macro_rules! output {
    ($kernel:ident, $launcher:expr, $buffer:expr, [$m:expr, $k:expr, $n:expr]) => {{
        use $kernel::F;
        let io = Gemm8OutLaunch::new(
            $buffer(),
            $buffer(),
            $buffer(),
            $buffer(),
            $buffer(),
            $m,
            $n,
            $k,
        );
        <Gemm8Out<F> as LaunchArg>::register(io, $launcher)
    }};
}

/// Checks the CUDA C++ of the bf16 tile launch for `[m, k, n]` (`split`: its K split over
/// cubes) and, when split, of the sum after it, expanded with `client`'s runtime (written as
/// `name.cu` and `name_sum.cu` where asked).
fn source<R: Runtime>(
    client: &ComputeClient<R>,
    name: &str,
    [m, k, n]: [usize; 3],
    fp8: bool,
    split: bool,
    residual: bool,
) {
    let plan = EpiloguePlan {
        fp8,
        sa_scalar: false,
        sb_scalar: false,
        has_bias: false,
        has_residual: residual,
        gate: None,
    };
    let acc = if fp8 { DType::F32 } else { DType::I32 };
    let dtypes = [DType::BF16.elem_type(), acc.elem_type()];
    let buffer = || cuda_source::buffer(client);
    let pitch = crate::format::row_pitch(k) / 16;
    let (settings, mut launcher) = cuda_source::launcher(client, 128);
    launcher.with_scope(|scope| {
        scope.register_type::<DynamicScalar<gemm8_mma_kernel::_F>>(dtypes[0]);
        scope.register_type::<DynamicScalar<gemm8_mma_kernel::_Acc>>(dtypes[1]);
    });
    let a = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let b = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let io = output!(gemm8_mma_kernel, &mut launcher, buffer, [m, k, n]);
    let partials = <[gemm8_mma_kernel::Acc] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (K steps per slice, the operands' pitches in 16-byte vectors) register their
    // values; their compilation argument is `()`.
    for v in [k.div_ceil(32), pitch, pitch] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = gemm8_mma_kernel::Gemm8MmaKernel::<R>::new(
        settings,
        client.clone(),
        a,
        b,
        io,
        partials,
        (),
        (),
        (),
        plan,
        split,
        dtypes,
    );
    cuda_source::check(name, kernel.define());
    if split {
        let (settings, mut launcher) = cuda_source::launcher(client, 256);
        launcher.with_scope(|scope| {
            scope.register_type::<DynamicScalar<gemm8_split_sum_kernel::_F>>(dtypes[0]);
            scope.register_type::<DynamicScalar<gemm8_split_sum_kernel::_Acc>>(dtypes[1]);
        });
        use gemm8_split_sum_kernel::Acc;
        let partials = <[Acc] as LaunchArg>::register(buffer(), &mut launcher);
        let io = output!(gemm8_split_sum_kernel, &mut launcher, buffer, [m, k, n]);
        <usize as LaunchArg>::register(5, &mut launcher);
        let kernel = gemm8_split_sum_kernel::Gemm8SplitSumKernel::<R>::new(
            settings,
            client.clone(),
            partials,
            io,
            (),
            plan,
            dtypes,
        );
        cuda_source::check(&format!("{name}_sum"), kernel.define());
    }
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    for fp8 in [false, true] {
        let format = if fp8 { "fp8" } else { "int8" };
        // 512 rows: o's 48 tiles split K over 5 cubes, gate-up's 560 tiles fill the GPU.
        source(
            client,
            &format!("tiled_{format}_o"),
            [512, 1536, 1536],
            fp8,
            true,
            true,
        );
        let gate_up = [512, 1536, 17920];
        source(
            client,
            &format!("tiled_{format}_gate_up"),
            gate_up,
            fp8,
            false,
            false,
        );
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
