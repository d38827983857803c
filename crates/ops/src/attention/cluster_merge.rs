//! How the cubes of a clustered decode launch (one thread-block cluster of [`CLUSTER_SPLITS`]
//! cubes along the keys of one KV head and row block, CUDA only) merge their splits, so that no
//! merge kernel follows.
//!
//! The block's output elements are dealt out over the cluster's cubes (element `e` to cube
//! `(e / units) % CLUSTER_SPLITS`), and every cube sends its partial of each element with
//! `st.async` straight into the shared memory of the cube that owns it, and its rows' `(max,
//! sum)` to every cube, each store completing bytes of the receiving cube's mbarrier. A cube
//! waits on its own mbarrier for exactly the bytes it owns, then combines them; a sender does not
//! wait for its own stores, as each receiver's wait covers every byte owed to it, so no cube
//! leaves while stores into its shared memory are outstanding. Handing the partials over through
//! global memory instead needs the cluster barrier's release, which ptxas turns into
//! `MEMBAR.ALL.GPU` (a wait for all of the cube's outstanding global writes), and a round trip
//! through L2: on the H100's 1.5B-shape decode step that hand-over took about 1 µs more per
//! layer.

use cubecl::prelude::*;

use super::geometry::Geometry;
use super::workspace::CLUSTER_SPLITS;
use crate::online_softmax::{exp_or_zero, EMPTY_MAX};

/// One output element from the [`CLUSTER_SPLITS`] splits' `(max, sum, acc)`.
#[cube]
fn combine_splits(ms: &Array<f32>, ls: &Array<f32>, accs: &Array<f32>) -> f32 {
    let splits = comptime![CLUSTER_SPLITS];
    let mut m = f32::new(EMPTY_MAX);
    #[unroll]
    for s in 0..splits {
        m = max(m, ms[s]);
    }
    let mut l = 0f32;
    let mut acc = 0f32;
    #[unroll]
    for s in 0..splits {
        let w = exp_or_zero(ms[s], m);
        l += ls[s] * w;
        acc += accs[s] * w;
    }
    select(l > 0f32, acc / l, 0f32)
}

/// The receive slots a cube of `units` units holds per split: the most output elements of a
/// 16-row block of head dimension `d` it can own. Element `e` of the block (row `e / d`) belongs
/// to cube `(e / units) % CLUSTER_SPLITS`, which combines it in unit `e % units`.
pub(crate) fn exchange_slots(d: usize, units: usize) -> usize {
    (16 * d).div_ceil(CLUSTER_SPLITS * units) * units
}

/// The length in f32 of a cube's receive buffer: every split's slots, then every split's
/// `(max, sum)` of the block's 16 rows.
pub(crate) fn exchange_len(d: usize, units: usize) -> usize {
    CLUSTER_SPLITS * (exchange_slots(d, units) + 32)
}

/// The shared-window address of a shared-memory slice (what `mbarrier`, `mapa` and `st.async`
/// take).
#[cube]
#[allow(clippy::identity_op)]
pub(crate) fn window_address<T: CubePrimitive>(slice: &[T]) -> u32 {
    let ptr = unsafe { slice.as_ptr_unchecked() };
    let address: u32;
    gpu_asm!(
        "{{ .reg .u64 g; cvta.to.shared.u64 g, {p}; cvt.u32.u64 {a}, g; }}",
        p = in(_) ptr,
        a = out(_) address,
    );
    // A new immutable value: inline PTX takes a variable an `out` operand wrote by its address.
    address + 0u32
}

/// The rows of the cube's 16-row block that exist (the same in every cube of a cluster): what
/// a split's partials hold and what the exchange sends.
#[cube]
pub(crate) fn block_rows(geo: &Geometry) -> u32 {
    let first_rho = (CUBE_POS_Z % geo.row_blocks) * 16;
    min(geo.lq * geo.group - first_rho, 16)
}

/// The start of a clustered launch's exchange, before anything is sent: unit 0 initialises the
/// cube's mbarrier (at `bar`) with one arrival, its own, which also announces every byte the
/// cube will receive (its owned elements and the rows' statistics, from every split), and all
/// units arrive at the cluster barrier (relaxed: only the fenced initialisation has to be
/// visible), which [`exchange_ready`] waits for before the first send.
#[cube]
pub(crate) fn exchange_begin(
    bar: u32,
    geo: &Geometry,
    #[comptime] d: usize,
    #[comptime] units: usize,
) {
    let per_pass = comptime![(CLUSTER_SPLITS * units) as u32];
    let rows = block_rows(geo);
    let total = rows * d as u32;
    let lead = CUBE_POS_X * units as u32;
    let owned = total / per_pass * units as u32
        + min((total % per_pass).saturating_sub(lead), units as u32);
    let bytes = (owned + 2 * rows) * comptime![4 * CLUSTER_SPLITS as u32];
    if UNIT_POS == 0 {
        gpu_asm!(
            "mbarrier.init.shared::cta.b64 [{b}], 1; mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n}; fence.mbarrier_init.release.cluster;",
            b = in(_) bar,
            n = in(_) bytes,
        );
    }
    gpu_asm!("barrier.cluster.arrive.relaxed.aligned;");
}

/// Waits until every cube of the cluster has initialised its mbarrier (all units, before the
/// first send).
#[cube]
pub(crate) fn exchange_ready() {
    gpu_asm!("barrier.cluster.wait.aligned;");
}

/// Sends `(max, sum)` of row `r` of this cube's split to every cube of the cluster.
#[cube]
pub(crate) fn send_stats(
    recv: u32,
    bar: u32,
    r: u32,
    m: f32,
    l: f32,
    #[comptime] d: usize,
    #[comptime] units: usize,
) {
    let slots = comptime![exchange_slots(d, units) as u32];
    let slot = comptime![CLUSTER_SPLITS as u32] * slots + (CUBE_POS_X * 16 + r) * 2;
    let local = recv + slot * 4;
    let mb = u32::reinterpret(m);
    let lb = u32::reinterpret(l);
    #[unroll]
    for c in 0..CLUSTER_SPLITS {
        let rank = comptime![c as u32];
        gpu_asm!(
            "{{ .reg .u32 r, rb; mapa.shared::cluster.u32 r, {a}, {c}; mapa.shared::cluster.u32 rb, {b}, {c}; st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [r], {{{m}, {l}}}, [rb]; }}",
            a = in(_) local,
            b = in(_) bar,
            c = in(_) rank,
            m = in(_) mb,
            l = in(_) lb,
        );
    }
}

/// Sends element `e` of this cube's partial accumulator (the block's element, row `e / d`) to
/// the cube that owns it.
#[cube]
pub(crate) fn send_element(
    recv: u32,
    bar: u32,
    e: u32,
    acc: f32,
    #[comptime] d: usize,
    #[comptime] units: usize,
) {
    let u = comptime![units as u32];
    let splits = comptime![CLUSTER_SPLITS as u32];
    let slots = comptime![exchange_slots(d, units) as u32];
    let pass = e / u;
    let owner = pass % splits;
    let slot = CUBE_POS_X * slots + pass / splits * u + e % u;
    let local = recv + slot * 4;
    let bits = u32::reinterpret(acc);
    gpu_asm!(
        "{{ .reg .u32 r, rb; mapa.shared::cluster.u32 r, {a}, {c}; mapa.shared::cluster.u32 rb, {b}, {c}; st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [r], {v}, [rb]; }}",
        a = in(_) local,
        b = in(_) bar,
        c = in(_) owner,
        v = in(_) bits,
    );
}

/// Waits (every unit) until the cube's mbarrier `bar_sh` has received every byte
/// [`exchange_begin`] announced; its acquire at cluster scope makes the received elements
/// visible. The mbarrier is named by its slice here, not by the address taken at the start, so
/// that the slice stays live to the end: shared memory is allocated by liveness, and a slice
/// last used at the start could share its bytes with a later one.
#[cube]
pub(crate) fn exchange_wait(bar_sh: &[u64]) {
    let bar = window_address::<u64>(bar_sh);
    gpu_asm!(
        "{{ .reg .pred p; exchange_wait: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [{b}], 0; @!p bra exchange_wait; }}",
        b = in(_) bar,
    );
}

/// Combines the elements this cube owns over the splits into the output rows `orow_sh` (the
/// block's, the same in every cube of the cluster), with the merge kernel's formula: weights
/// `exp(max_s - max)`, splits that saw no key weigh 0.
#[cube]
pub(crate) fn exchange_combine<F: Float>(
    recv_sh: &[f32],
    out: &mut [F],
    orow_sh: &[u32],
    rows_here: u32,
    #[comptime] d: usize,
    #[comptime] units: usize,
) {
    let splits = comptime![CLUSTER_SPLITS];
    let slots = comptime![exchange_slots(d, units)];
    let total = rows_here as usize * d;
    for j in range_stepped(UNIT_POS as usize, slots, units) {
        let e = ((j / units) * splits + CUBE_POS_X as usize) * units + j % units;
        if e < total {
            let r = e / d;
            let mut ms = Array::<f32>::new(splits);
            let mut ls = Array::<f32>::new(splits);
            let mut accs = Array::<f32>::new(splits);
            #[unroll]
            for s in 0..splits {
                let st = splits * slots + (s * 16 + r) * 2;
                ms[s] = recv_sh[st];
                ls[s] = recv_sh[st + 1];
                accs[s] = recv_sh[s * slots + j];
            }
            out[orow_sh[r] as usize * d + e % d] = F::cast_from(combine_splits(&ms, &ls, &accs));
        }
    }
}
