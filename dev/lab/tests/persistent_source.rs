//! The CUDA source of the persistent step's weight stream and of the ring chain's stage
//! (`lab::persistent`), built without a GPU: the kernel's ring (mbarriers completed by `cp.async.bulk`), its counters and its named
//! barrier are inline PTX that only NVRTC and ptxas check. The sources are written to
//! `$CUBELLM_CUDA_SOURCE_DIR` for `dev/cuda_compile/check.py`; `lab --runtime cuda persistent`
//! runs and checks the kernel on a GPU.

use cubecl::prelude::*;
use lab::persistent::{persistent_stream, ring_stage, Ring, Variant, CUBE_UNITS, VARIANTS};
use lab::persistent_gemv;
use testkit::cuda_source;

fn case<R: Runtime>(client: &ComputeClient<R>) {
    // The deepest ring and the shallowest: the ring's depth and chunk are compile-time.
    for (name, variant) in [
        ("persistent_stream_24x8k", VARIANTS[0]),
        ("persistent_stream_2x8k", VARIANTS[3]),
    ] {
        let Ring { slots, chunk } = variant.ring();
        let (settings, mut launcher) = cuda_source::launcher(client, CUBE_UNITS);
        let mut arg = || <[u32] as LaunchArg>::register(cuda_source::buffer(client), &mut launcher);
        let (weights, stages, y, counters) = (arg(), arg(), arg(), arg());
        let kernel = persistent_stream::PersistentStream::<R>::new(
            settings,
            client.clone(),
            weights,
            stages,
            y,
            counters,
            slots,
            chunk,
        );
        let source = cuda_source::check(name, kernel.define());
        for needle in [
            "cp.async.bulk.shared::cluster.global",
            "mbarrier.try_wait.parity",
            "ld.acquire.gpu",
            "bar.sync 1, 256",
        ] {
            assert!(source.contains(needle), "{name}: no {needle}: {source}");
        }
    }
    let Some(Variant::Chain(Ring { slots, chunk })) = VARIANTS.last().copied() else {
        panic!("the last variant is the ring chain");
    };
    let (settings, mut launcher) = cuda_source::launcher(client, CUBE_UNITS);
    let mut arg = || <[u32] as LaunchArg>::register(cuda_source::buffer(client), &mut launcher);
    let (weights, stages, y) = (arg(), arg(), arg());
    // The stage index is a scalar: it registers its value; its compilation argument is `()`.
    <u32 as LaunchArg>::register(3u32, &mut launcher);
    let kernel = ring_stage::RingStage::<R>::new(
        settings,
        client.clone(),
        weights,
        stages,
        y,
        (),
        slots,
        chunk,
    );
    let source = cuda_source::check("ring_stage_12x8k", kernel.define());
    // The kernel's own wait (after the producer's first copies), not the prologue's.
    let wait = source.find("griddepcontrol.wait").expect("a wait");
    let copy = source.find("cp.async.bulk").expect("a bulk copy");
    assert!(
        copy < wait,
        "ring_stage: the wait comes before the copies: {source}"
    );

    let Ring { slots, chunk } = persistent_gemv::RING;
    let (settings, mut launcher) = cuda_source::launcher(client, CUBE_UNITS);
    let mut arg = || <[u32] as LaunchArg>::register(cuda_source::buffer(client), &mut launcher);
    let (weights, stages) = (arg(), arg());
    let acts = <[f32] as LaunchArg>::register(cuda_source::buffer(client), &mut launcher);
    let counters = <[u32] as LaunchArg>::register(cuda_source::buffer(client), &mut launcher);
    let kernel = persistent_gemv::persistent_gemv::PersistentGemv::<R>::new(
        settings,
        client.clone(),
        weights,
        stages,
        acts,
        counters,
        slots,
        chunk,
    );
    let source = cuda_source::check("persistent_gemv_20x8k", kernel.define());
    assert!(
        source.contains("cp.async.bulk"),
        "persistent_gemv: {source}"
    );
}

#[test]
fn persistent_stream_builds_for_sm90() {
    testkit::on_first_runtime!(case);
}
