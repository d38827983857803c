//! The split argmax's CUDA C++ for an sm_90 device, built on any machine
//! (`testkit::cuda_source`): it runs only on CUDA, so no other test compiles it without a GPU.
//! The decode step's launch (152k bf16 logits, the counters advanced, the chosen id's
//! 1 536-wide embedding row gathered) and the plain one must compile.

use cubecl::prelude::*;
use testkit::cuda_source;

use super::{argmax_split_kernel, SplitShape};
use crate::DType;

/// bf16 elements per 16-byte vector.
const VEC: usize = 8;

/// Checks the CUDA C++ of the split argmax over `n` bf16 logits on an H100 (132 SMs), advancing
/// and gathering as asked (written as `name.cu` where asked).
fn source<R: Runtime>(
    client: &ComputeClient<R>,
    name: &str,
    n: usize,
    advance: bool,
    gather: bool,
) {
    let shape = SplitShape::new(n / VEC, 132);
    let elem = DType::BF16.elem_type();
    let (settings, mut launcher) =
        cuda_source::launcher_of(client, CubeDim::new_1d(super::SPLIT_CUBE));
    launcher.with_scope(|scope| {
        scope.register_size::<DynamicSize<argmax_split_kernel::_N>>(VEC);
        scope.register_type::<DynamicScalar<argmax_split_kernel::_F>>(elem);
    });
    use argmax_split_kernel::{F, N};
    let buffer = || cuda_source::buffer(client);
    let x = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let partials = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let counters = <[Atomic<u32>] as LaunchArg>::register(buffer(), &mut launcher);
    let mut ids = || <[u32] as LaunchArg>::register(buffer(), &mut launcher);
    let (out, first, second, even, odd) = (ids(), ids(), ids(), ids(), ids());
    let table = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    let next_row = <[Vector<F, N>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (the logits, the gathered row in vectors) register their values; their
    // compilation argument is `()`.
    for v in [n, 1536 / VEC] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = argmax_split_kernel::ArgmaxSplitKernel::<R>::new(
        settings,
        client.clone(),
        x,
        partials,
        counters,
        out,
        first,
        second,
        even,
        odd,
        table,
        next_row,
        (),
        (),
        VEC,
        shape,
        advance,
        gather,
        elem,
    );
    cuda_source::check(name, kernel.define());
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    source(client, "argmax_split_decode_step", 151_936, true, true);
    source(client, "argmax_split", 151_936, false, false);
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
