//! The skinny 8-bit tensor-core kernel's CUDA C++ for an sm_90 device, built on any machine
//! (`testkit::cuda_source`): the 1.5B model's projections as W8A8 and FP8 decode them (qkv and o
//! quantizing x in the kernel, gate-up and down reading a pre-pass's codes) and 16 rows must
//! compile, with no `mma` operand passed by address.

use cubecl::prelude::*;
use ops::matmul::Activation;
use ops::DType;
use testkit::cuda_source;

use super::super::epilogue::{EpiloguePlan, Gemm8Out, Gemm8OutLaunch};
use super::{gemm8_skinny_kernel, skinny_plan, XSource};
use crate::rowquant::RowQuantPlan;

/// SMs of an sm_90 device as the CUDA runtime reports an H100 or H200.
const SM90_SMS: usize = 132;

/// Checks the CUDA C++ of the bf16 launch for `[m, k, n]` on an sm_90 device with the codes from
/// `source`, expanded with `client`'s runtime (written as `name.cu` where asked).
fn source<R: Runtime>(
    client: &ComputeClient<R>,
    name: &str,
    mkn: [usize; 3],
    fp8: bool,
    gate: Option<Activation>,
    norm: bool,
    source: XSource,
) {
    let [m, k, n] = mkn;
    let epi = EpiloguePlan {
        fp8,
        sa_scalar: false,
        sb_scalar: false,
        has_bias: false,
        has_residual: gate.is_none(),
        gate,
    };
    let a_pitch = crate::format::row_pitch(k);
    let (plan, units, _) = skinny_plan(mkn, epi, fp8, source, a_pitch, SM90_SMS, true, |units| {
        RowQuantPlan {
            reduce: cuda_source::sm90_reduce(units),
            fp8,
            // bf16 rows in 4-element vectors, as CUDA loads them.
            vector: 4,
            norm,
        }
    });
    let acc = if fp8 { DType::F32 } else { DType::I32 };
    let dtypes = [DType::BF16.elem_type(), acc.elem_type()];
    let (settings, mut launcher) = cuda_source::launcher(client, units);
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<gemm8_skinny_kernel::_NX>>(plan.rows.vector);
        scope.register_type::<DynamicScalar<gemm8_skinny_kernel::_F>>(dtypes[0]);
        scope.register_type::<DynamicScalar<gemm8_skinny_kernel::_Acc>>(dtypes[1]);
    });
    use gemm8_skinny_kernel::{F, NX};
    let buffer = || cuda_source::buffer(client);
    let a = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let x = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    let b = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let io = Gemm8OutLaunch::new(buffer(), buffer(), buffer(), buffer(), buffer(), m, n, k);
    let io = <Gemm8Out<F> as LaunchArg>::register(io, &mut launcher);
    let norm_w = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (eps; the codes' and the weight's pitch in 16-byte vectors) register their values;
    // their compilation argument is `()`.
    <f32 as LaunchArg>::register(1e-6, &mut launcher);
    for v in [a_pitch / 16, a_pitch / 16] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = gemm8_skinny_kernel::Gemm8SkinnyKernel::<R>::new(
        settings,
        client.clone(),
        a,
        x,
        b,
        io,
        norm_w,
        (),
        (),
        (),
        plan.rows.vector,
        plan,
        dtypes,
    );
    cuda_source::check(name, kernel.define());
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    let silu = Some(Activation::Silu);
    for fp8 in [false, true] {
        let format = if fp8 { "fp8" } else { "int8" };
        for (name, mkn, gate, norm, x) in [
            ("qkv", [1, 1536, 2048], None, true, XSource::Quantize),
            ("o", [1, 1536, 1536], None, false, XSource::Quantize),
            ("gate_up", [1, 1536, 17920], silu, false, XSource::Staged),
            ("down", [1, 8960, 1536], None, false, XSource::Staged),
            (
                "down_16rows",
                [16, 8960, 1536],
                None,
                false,
                XSource::Global,
            ),
        ] {
            source(
                client,
                &format!("skinny_{format}_{name}"),
                mkn,
                fp8,
                gate,
                norm,
                x,
            );
        }
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
