//! Whether a kernel can reach distributed shared memory through `gpu_asm!`: a slice of shared
//! memory gives its pointer (`as_ptr_unchecked`), which inline PTX turns into a shared-window
//! address (`cvta.to.shared`) and maps into another cube of the cluster (`mapa.shared::cluster`).
//! Two hand-overs are built: a store to the other cube followed by the cluster barrier with
//! release / acquire semantics (`release`, which ptxas 12.9 turns into `MEMBAR.ALL.GPU` on
//! sm_90a, a wait for every outstanding global write, as any release at cluster scope), and
//! `st.async` stores that complete transactions on the receiving cube's mbarrier (`async`:
//! `STAS` and the receiver's `SYNCS.PHASECHK` wait on its own mbarrier, no fence). This is the
//! way a decode attention's cluster could merge its splits without the partials' round trip
//! through global memory. The CUDA sources are built here without a GPU and written to
//! `$CUBELLM_CUDA_SOURCE_DIR` for `dev/cuda_compile/check.py` (NVRTC and ptxas); not run.

use cubecl::prelude::*;
use testkit::cuda_source;

/// Each unit stores its index into its element of the other cube of its cluster of two, then
/// reads back what the other cube stored into its own.
#[cube(launch_unchecked, cluster_dim = CubeDim::new_3d(2, 1, 1))]
fn dsmem_probe(out: &mut [f32], #[comptime] use_async: bool) {
    let mut buf = Shared::<[f32]>::new_slice(256usize);
    let bar = Shared::<[u64]>::new_slice(1usize);
    let unit = UNIT_POS as usize;
    let start = unsafe { buf.as_ptr_unchecked() };
    let bar_ptr = unsafe { bar.as_ptr_unchecked() };
    buf[unit] = 0f32;
    if use_async && UNIT_POS == 0 {
        // One arrival (this unit's, with the 1 024 bytes the other cube's units will store).
        gpu_asm!(
            "{{ .reg .u64 g; .reg .u32 b; cvta.to.shared.u64 g, {m}; cvt.u32.u64 b, g; mbarrier.init.shared::cta.b64 [b], 1; mbarrier.arrive.expect_tx.shared::cta.b64 _, [b], 1024; fence.mbarrier_init.release.cluster; }}",
            m = in(_) bar_ptr,
        );
    }
    // Relaxed: only the mbarrier's initialisation (fenced above) must be visible.
    gpu_asm!("barrier.cluster.arrive.relaxed.aligned; barrier.cluster.wait.aligned;");
    let offset = UNIT_POS * 4u32;
    let other = CUBE_POS_X ^ 1u32;
    let value = f32::cast_from(UNIT_POS);
    if use_async {
        gpu_asm!(
            "{{ .reg .u64 g, h; .reg .u32 s, r, b, rb; cvta.to.shared.u64 g, {p}; cvt.u32.u64 s, g; add.u32 s, s, {o}; mapa.shared::cluster.u32 r, s, {c}; cvta.to.shared.u64 h, {m}; cvt.u32.u64 b, h; mapa.shared::cluster.u32 rb, b, {c}; st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [r], {v}, [rb]; }}",
            p = in(_) start,
            o = in(_) offset,
            c = in(_) other,
            m = in(_) bar_ptr,
            v = in(_) u32::reinterpret(value),
        );
        gpu_asm!(
            "{{ .reg .u64 h; .reg .u32 b; .reg .pred p; cvta.to.shared.u64 h, {m}; cvt.u32.u64 b, h; dsmem_probe_wait: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [b], 0; @!p bra dsmem_probe_wait; }}",
            m = in(_) bar_ptr,
        );
    } else {
        gpu_asm!(
            "{{ .reg .u64 g; .reg .u32 s, r; cvta.to.shared.u64 g, {p}; cvt.u32.u64 s, g; add.u32 s, s, {o}; mapa.shared::cluster.u32 r, s, {c}; st.shared::cluster.f32 [r], {v}; }}",
            p = in(_) start,
            o = in(_) offset,
            c = in(_) other,
            v = in(_) value,
        );
        gpu_asm!("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;");
    }
    out[ABSOLUTE_POS] = buf[unit];
    // No cube leaves while the other may still store into its shared memory.
    gpu_asm!("barrier.cluster.arrive.relaxed.aligned; barrier.cluster.wait.aligned;");
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    for (name, use_async) in [("dsmem_probe_release", false), ("dsmem_probe_async", true)] {
        let (settings, mut launcher) = cuda_source::launcher(client, 256);
        let out = <[f32] as LaunchArg>::register(cuda_source::buffer(client), &mut launcher);
        let kernel = dsmem_probe::DsmemProbe::<R>::new(settings, client.clone(), out, use_async);
        let source = cuda_source::check(name, kernel.define());
        assert!(source.contains("mapa.shared::cluster"), "{name}: {source}");
    }
}

#[test]
fn dsmem_probe_builds_for_sm90() {
    testkit::on_first_runtime!(case);
}
