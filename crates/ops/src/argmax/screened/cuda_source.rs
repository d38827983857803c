//! The screened argmax's CUDA C++ for an sm_90 device, built on any machine
//! (`testkit::cuda_source`), at the 1.5B decode step's shape (151 936 bf16 logits over 1 536
//! inputs, the counters advanced and the 1 536-wide embedding row gathered): the CUDA tests run
//! only with a GPU, so this is what compiles it without one.

use cubecl::prelude::*;
use testkit::cuda_source;

use super::{finish_kernel, rescore_kernel, threshold_kernel, ScreenPlan, CUBE};
use crate::reduce::ReducePlan;
use crate::DType;

/// bf16 elements per 16-byte vector.
const VEC: usize = 8;
const VOCAB: usize = 151_936;
const HIDDEN: usize = 1536;

/// The H100's reduction plan: 32-lane planes.
fn reduce() -> ReducePlan {
    ReducePlan {
        cube_dim: CUBE,
        use_plane: true,
        plane_size_min: 32,
        plane_size_fixed: true,
    }
}

fn threshold<R: Runtime>(client: &ComputeClient<R>) {
    let elem = DType::BF16.elem_type();
    let (settings, mut launcher) = cuda_source::launcher_of(client, CubeDim::new_1d(CUBE));
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<threshold_kernel::_N>>(VEC);
        scope.register_type::<DynamicScalar<threshold_kernel::_F>>(elem);
    });
    use threshold_kernel::{F, N};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let approx = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let coef = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let state = <[Atomic<u32>] as LaunchArg>::register(buffer(), &mut launcher);
    for v in [HIDDEN / VEC, VOCAB] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    <f32 as LaunchArg>::register(1.0 / 128.0, &mut launcher);
    let kernel = threshold_kernel::ThresholdKernel::<R>::new(
        settings,
        client.clone(),
        x,
        approx,
        coef,
        state,
        (),
        (),
        (),
        VEC,
        reduce(),
        elem,
    );
    cuda_source::check("screened_argmax_threshold", kernel.define());
}

fn rescore<R: Runtime>(client: &ComputeClient<R>) {
    let plan = ScreenPlan::new(VOCAB, HIDDEN / VEC, 132, 32, true, reduce());
    let elem = DType::BF16.elem_type();
    let dim = CubeDim::new_2d(plan.lanes * plan.splits, plan.groups());
    let (settings, mut launcher) = cuda_source::launcher_of(client, dim);
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<rescore_kernel::_N>>(VEC);
        scope.register_type::<DynamicScalar<rescore_kernel::_F>>(elem);
    });
    use rescore_kernel::{F, N};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let w = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let approx = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let coef = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let state = <[Atomic<u32>] as LaunchArg>::register(buffer(), &mut launcher);
    let partials = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    for v in [VOCAB, HIDDEN / VEC] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    <f32 as LaunchArg>::register(1.0 / 128.0, &mut launcher);
    let kernel = rescore_kernel::RescoreKernel::<R>::new(
        settings,
        client.clone(),
        x,
        w,
        approx,
        coef,
        state,
        partials,
        (),
        (),
        (),
        VEC,
        plan,
        elem,
    );
    cuda_source::check("screened_argmax_rescore", kernel.define());
}

fn finish<R: Runtime>(client: &ComputeClient<R>) {
    let cubes = ScreenPlan::new(VOCAB, HIDDEN / VEC, 132, 32, true, reduce()).cubes as usize;
    let elem = DType::BF16.elem_type();
    let (settings, mut launcher) = cuda_source::launcher_of(client, CubeDim::new_1d(CUBE));
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<finish_kernel::_N>>(VEC);
        scope.register_type::<DynamicScalar<finish_kernel::_F>>(elem);
    });
    use finish_kernel::{F, N};
    let buffer = || cuda_source::buffer(client);
    let partials = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let state = <[Atomic<u32>] as LaunchArg>::register(buffer(), &mut launcher);
    let mut ids = || <[u32] as LaunchArg>::register(buffer(), &mut launcher);
    let (out, first, second, even, odd) = (ids(), ids(), ids(), ids(), ids());
    let table = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let next_row = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    for v in [cubes, VOCAB, HIDDEN / VEC] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = finish_kernel::FinishKernel::<R>::new(
        settings,
        client.clone(),
        partials,
        state,
        out,
        first,
        second,
        even,
        odd,
        table,
        next_row,
        (),
        (),
        (),
        VEC,
        true,
        true,
        elem,
    );
    cuda_source::check("screened_argmax_finish", kernel.define());
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    threshold(client);
    rescore(client);
    finish(client);
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
