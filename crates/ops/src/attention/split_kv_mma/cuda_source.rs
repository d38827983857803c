//! The tensor-core decode attention's CUDA C++ for an sm_90 device, built on any machine
//! (`testkit::cuda_source`): the 1.5B model's decode step (head dim 128, 12 query heads over 2
//! KV heads) on the clustered launch that merges its own splits, on the plain split launch of
//! long caches that merges its own partials and on that of a 4k cache (four planes, the merge
//! kernel after it), all with RoPE and the cache append inside, must compile, with no `mma`
//! operand passed by address.

use cubecl::prelude::*;
use testkit::cuda_source;

use super::{
    split_kv_mma_cluster_kernel, split_kv_mma_kernel, RopeTablesLaunch, SplitKvMmaBlueprint,
};
use crate::attention::geometry::{GeometryLaunch, SplitBuffersLaunch};
use crate::attention::merge::MergeBlueprint;
use crate::attention::workspace::CLUSTER_SPLITS;
use crate::attention::SplitKvTiling;
use crate::DType;

/// Checks the CUDA C++ of a bf16 decode launch of `blueprint` over `splits` key splits of a
/// `kv_rows`-row cache (the clustered kernel with `clustered`), expanded with `client`'s
/// runtime (written as `name.cu` where asked).
fn source<R: Runtime>(
    client: &ComputeClient<R>,
    name: &str,
    blueprint: SplitKvMmaBlueprint,
    [kv_rows, splits]: [usize; 2],
    clustered: bool,
) {
    let elem = DType::BF16.elem_type();
    let (settings, mut launcher) = cuda_source::launcher(client, (32 * blueprint.warps) as u32);
    let buffer = || cuda_source::buffer(client);
    let (hq, hkv, d) = (12u32, 2u32, blueprint.d);
    let geo = GeometryLaunch::new(
        0,
        1,
        hq,
        hkv,
        hq / hkv,
        kv_rows as u32,
        kv_rows.div_ceil(splits) as u32,
        splits as u32,
        1,
        1.0 / (d as f32).sqrt(),
        0,
        1,
    );
    let rope = RopeTablesLaunch::new(buffer(), buffer(), kv_rows as u32);
    macro_rules! define {
        ($kernel:ident, $ty:ident $(, $extra:ident)?) => {{
            launcher.with_scope(|scope| {
                scope.register_type::<DynamicScalar<$kernel::_F>>(elem);
            });
            use $kernel::F;
            let io = SplitBuffersLaunch::new(
                buffer(),
                buffer(),
                buffer(),
                buffer(),
                buffer(),
                buffer(),
                buffer(),
            );
            let io = <super::SplitBuffers<F, f32> as LaunchArg>::register(io, &mut launcher);
            let geo = <super::Geometry as LaunchArg>::register(geo, &mut launcher);
            let rope = <super::RopeTables as LaunchArg>::register(rope, &mut launcher);
            $(let $extra = <[Atomic<u32>] as LaunchArg>::register(buffer(), &mut launcher);)?
            $kernel::$ty::<R>::new(
                settings,
                client.clone(),
                io,
                geo,
                rope,
                $($extra,)?
                blueprint,
                elem,
            )
            .define()
        }};
    }
    let definition = if clustered {
        define!(split_kv_mma_cluster_kernel, SplitKvMmaClusterKernel)
    } else {
        define!(split_kv_mma_kernel, SplitKvMmaKernel, counters)
    };
    cuda_source::check(name, definition);
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    // Eight planes on 128-key tiles: the decode tiling of the clustered launch and of long
    // caches.
    let wide = SplitKvTiling {
        warps: 8,
        bk: 128,
        cubes_per_sm: 1,
    };
    // The model's decode launch on a tiling: split, signalling its dependents first, the older
    // keys queued before its wait, RoPE and the cache append inside.
    let decode = |tiling| SplitKvMmaBlueprint {
        partial: true,
        trigger: true,
        early: true,
        rope: true,
        ..SplitKvMmaBlueprint::new(128, tiling, true, true)
    };
    let blueprint = decode(wide);
    // 1 024 cache rows over the cluster's splits; 32 768 rows over 64 splits.
    let cluster = SplitKvMmaBlueprint {
        exchange: true,
        ..blueprint
    };
    source(
        client,
        "attention_decode_cluster",
        cluster,
        [1024, CLUSTER_SPLITS],
        true,
    );
    // The long cache's launch merges its own partials (its cubes all fit the GPU at once).
    let long = SplitKvMmaBlueprint {
        merge: Some(MergeBlueprint::for_cube(client, 128, 64, 32 * wide.warps)),
        ..blueprint
    };
    source(client, "attention_decode_long", long, [32768, 64], false);
    // A 4k cache: four planes on 64-key tiles, the planes' merge buffers of their own, and the
    // merge kernel after it.
    let short = decode(SplitKvTiling::default());
    assert!(!short.stage_merge);
    source(client, "attention_decode_4k", short, [4352, 34], false);
}

#[test]
fn cuda_sources_build_for_sm90() {
    testkit::on_first_runtime!(case);
}
