//! The persistent decode step's weight stream written in CubeCL: whether the DSL can express the
//! kernel that `dev/add_controls/persistent_step.cu` prices in CUDA C, and at what speed.
//!
//! One cube per SM stays resident for the whole step. Its last plane is a producer: one unit
//! issues `cp.async.bulk` copies of the cube's share of every stage's weights, in chunks of
//! `chunk` 16-byte vectors, into a ring of `slots` chunks of shared memory, each completing the
//! bytes it announced on the slot's "full" mbarrier; it waits only for a slot's "empty" mbarrier,
//! so it runs as far ahead as the ring holds, across stage and layer ends. The other eight planes
//! consume: before a stage they wait until every cube of the stage before has released its
//! result (a counter per stage, a release add by each finishing cube, an acquire read by unit 0
//! and a named barrier for the rest), then fold each chunk into u32 sums (exact in any order)
//! and free its slot. A cube's sum goes to `y` and its counter add follows. The last cube to
//! finish the step zeroes the counters for the next launch.
//!
//! The stage list is the synthetic chain's (per layer qkv, the keys and values of a 640-token
//! context on 16 cubes, o, gate-up and down, with the 1.5B step's bytes at 8-bit and bf16 sizes),
//! laid out one after another in one buffer. A replay from zeroed sums is checked against
//! [`reference()`] before anything is timed.
//!
//! CUDA (sm_90) only: the copies, mbarriers and counters are inline PTX.
//!
//! Measured on an H200 (docs/investigations/persistent-step.md): 39.5 µs a layer at both sizes,
//! against 19.2 / 29.8 for the CUDA C kernel, so a cost fixed per stage bounds it, not the
//! stream; the persistent structure itself did not beat the five-launch chain, and was dropped.

// `x + 0` makes a new immutable value: inline PTX takes a mutable variable, or one an `out`
// operand wrote, by its address.
#![allow(clippy::identity_op)]

use bench::{capture, Case};
use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

/// The consumer units (eight planes); the producer plane comes after them.
pub const CONSUMERS: u32 = 256;
const _: () = assert!(CONSUMERS / 32 == 8, "the empty barriers count eight planes");
/// Units of a cube: the consumers and one producer plane.
pub const CUBE_UNITS: u32 = CONSUMERS + 32;
/// u32 words a stage takes in the stage table that both persistent kernels read, at the offsets
/// below. The u32 stream's stages are rows of one vector, of kind [`KIND_PLAIN`].
pub const STAGE_WORDS: usize = 8;
/// The stage's first weight vector.
pub const FIRST: usize = 0;
/// Its rows.
pub const ROWS: usize = 1;
/// K in 16-byte vectors.
pub const K_VECTORS: usize = 2;
/// The cubes it is dealt out over (cubes 0 .. this).
pub const CUBES: usize = 3;
/// Where x starts, in floats of the activations (the GEMVs only).
pub const X_OFF: usize = 4;
/// Where the outputs go, in floats of the activations (the GEMVs only).
pub const Y_OFF: usize = 5;
/// Its kind, a `KIND_*`.
pub const KIND: usize = 6;
/// The kind's offset into the activations (norm weights, bias or residual).
pub const AUX: usize = 7;

/// A stage's products only.
pub const KIND_PLAIN: u32 = 0;
/// x is RMS-normalised first (eps [`NORM_EPS`], the norm's weights at `AUX`), and a bias (at
/// `AUX + K`) is added to the products: the qkv projection.
pub const KIND_NORM_BIAS: u32 = 1;
/// The residual at `AUX` is added to the products: o and down.
pub const KIND_RESIDUAL: u32 = 2;
/// x is RMS-normalised as for [`KIND_NORM_BIAS`]; rows come in (gate, up) pairs, dealt out
/// whole, and each pair gives one output, `silu(gate) * up`: gate-up with SwiGLU.
pub const KIND_NORM_SWIGLU: u32 = 3;
/// The norms' epsilon.
pub const NORM_EPS: f32 = 1e-6;
/// Sums a stage can hold in `y` (one a cube).
pub const Y_STRIDE: usize = 1024;
/// Layers of the synthetic step.
pub const LAYERS: usize = 28;

/// The shared-window address of byte `offset` of a shared slice (what `mbarrier` and
/// `cp.async.bulk` take).
#[cube]
pub(crate) fn window_at<T: CubePrimitive>(slice: &[T], offset: u32) -> u32 {
    let ptr = unsafe { slice.as_ptr_unchecked() };
    let address: u32;
    gpu_asm!(
        "{{ .reg .u64 g; .reg .u32 s; cvta.to.shared.u64 g, {p}; cvt.u32.u64 s, g; add.u32 {a}, s, {o}; }}",
        p = in(_) ptr,
        o = in(_) offset,
        a = out(_) address,
    );
    // A new immutable value: inline PTX takes a variable an `out` operand wrote by its address.
    address + 0u32
}

/// Waits until the mbarrier at `bar` has completed the phase of parity `parity`.
#[cube]
pub(crate) fn mbar_wait(bar: u32, parity: u32) {
    // Immutable copies: inline PTX takes a mutable variable (the ring's phase) by its address.
    let b = bar + 0u32;
    let q = parity + 0u32;
    loop {
        let ok: u32;
        gpu_asm!(
            "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {q}; selp.u32 {o}, 1, 0, p; }}",
            b = in(_) b,
            q = in(_) q,
            o = out(_) ok,
        );
        if ok == 1u32 {
            break;
        }
    }
}

/// The producer's copy of `vectors` 16-byte vectors from vector `first` of `weights` into the
/// shared-window address `dst`, announced on and completing the mbarrier `bar`.
#[cube]
pub(crate) fn bulk_copy(weights: &[u32], first: u32, vectors: u32, dst: u32, bar: u32) {
    let src = unsafe { weights.as_ptr_unchecked() };
    let bytes = vectors * 16u32;
    gpu_asm!(
        "{{ .reg .u64 g, o; mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n}; cvta.to.global.u64 g, {s}; mul.wide.u32 o, {f}, 16; add.u64 g, g, o; cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [g], {n}, [{b}]; }}",
        b = in(_) bar,
        n = in(_) bytes,
        s = in(_) src,
        f = in(_) first,
        d = in(_) dst,
    );
}

/// The global address of word `index` of `words`, for inline PTX's `.global` accesses.
#[cube]
fn word_address(words: &mut [u32], index: u32) -> u64 {
    let ptr = unsafe { words.as_ptr_unchecked() };
    let address: u64;
    gpu_asm!(
        "{{ .reg .u64 g, o; cvta.to.global.u64 g, {p}; mul.wide.u32 o, {i}, 4; add.u64 {a}, g, o; }}",
        p = in(_) ptr,
        i = in(_) index,
        a = out(_) address,
    );
    address + 0u64
}

/// Word `index` of `words` read from L2 (written by other cubes of this launch).
#[cube]
fn load_l2(words: &mut [u32], index: u32) -> u32 {
    let address = word_address(words, index);
    let value: u32;
    gpu_asm!(
        "ld.global.cg.u32 {v}, [{a}];",
        a = in(_) address,
        v = out(_) value,
    );
    value + 0u32
}

/// Spins until counter `index` of `counters` reads at least `target` (acquire, GPU scope).
#[cube]
pub(crate) fn wait_counter(counters: &mut [u32], index: u32, target: u32) {
    let address = word_address(counters, index);
    loop {
        let seen: u32;
        gpu_asm!(
            "ld.acquire.gpu.global.u32 {v}, [{a}];",
            a = in(_) address,
            v = out(_) seen,
        );
        if seen >= target {
            break;
        }
    }
}

/// Adds `value` to counter `index` with release semantics at GPU scope and returns what it
/// held before.
#[cube]
pub(crate) fn add_counter(counters: &mut [u32], index: u32, value: u32) -> u32 {
    let address = word_address(counters, index);
    let old: u32;
    gpu_asm!(
        "atom.acq_rel.gpu.global.add.u32 {r}, [{a}], {v};",
        a = in(_) address,
        v = in(_) value,
        r = out(_) old,
    );
    old + 0u32
}

/// The consumer planes only (named barrier 1): the producer runs ahead.
#[cube]
pub(crate) fn consumers_sync() {
    gpu_asm!("bar.sync 1, 256;");
}

/// Cube `cube`'s share of a stage of `vectors` vectors over `cubes` cubes: `[begin, end)`.
#[cube]
pub(crate) fn stage_share(vectors: u32, cubes: u32, cube: u32) -> (u32, u32) {
    let per = vectors.div_ceil(cubes);
    let begin = min(cube * per, vectors);
    (begin, min(begin + per, vectors))
}

/// Cube `cube`'s rows of a stage of `rows` rows of kind `kind` over `cubes` cubes: whole
/// (gate, up) pairs for [`KIND_NORM_SWIGLU`].
#[cube]
pub(crate) fn row_share(rows: u32, cubes: u32, cube: u32, kind: u32) -> (u32, u32) {
    let paired = kind == KIND_NORM_SWIGLU;
    let (a, b) = stage_share(select(paired, rows / 2, rows), cubes, cube);
    (select(paired, 2 * a, a), select(paired, 2 * b, b))
}

/// Unit 0 initialises the ring's barriers (`bars`: `slots` full ones, then `slots` empty ones):
/// a full barrier expects the producer's arrival and its bytes, an empty one an arrival from
/// each consumer plane. Syncs the cube after.
#[cube]
pub(crate) fn ring_init(bars: &[u64], #[comptime] slots: u32) {
    if UNIT_POS == 0 {
        for s in 0..slots {
            let full = window_at::<u64>(bars, s * 8);
            let empty = window_at::<u64>(bars, (slots + s) * 8);
            gpu_asm!(
                "mbarrier.init.shared::cta.b64 [{f}], 1; mbarrier.init.shared::cta.b64 [{e}], 8;",
                f = in(_) full,
                e = in(_) empty,
            );
        }
        gpu_asm!("fence.mbarrier_init.release.cluster;");
    }
    sync_cube();
}

/// The ring's next slot and phase after slot `slot` of phase `phase`.
#[cube]
pub(crate) fn ring_next(slot: u32, phase: u32, #[comptime] slots: u32) -> (u32, u32) {
    let next = slot + 1;
    let wrap = next == slots;
    (select(wrap, 0u32, next), select(wrap, phase ^ 1u32, phase))
}

/// The producer's copies of vectors `[begin, end)` of a stage whose vectors start at vector
/// `first` of `weights`, chunk by chunk into the ring from slot `slot` of phase `phase`, each once
/// its slot is free (a fresh barrier counts as freed once: the wait on parity 1 passes). Returns
/// the ring's position after them.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn produce_share(
    weights: &[u32],
    ring: &[u32],
    bars: &[u64],
    first: u32,
    begin: u32,
    end: u32,
    slot: u32,
    phase: u32,
    #[comptime] slots: u32,
    #[comptime] chunk: u32,
) -> (u32, u32) {
    let mut at = (slot, phase);
    for v in range_stepped(begin, end, chunk) {
        let (s, p) = at;
        mbar_wait(window_at::<u64>(bars, (slots + s) * 8), p ^ 1u32);
        bulk_copy(
            weights,
            first + v,
            min(chunk, end - v),
            window_at::<u32>(ring, s * comptime![chunk * 16]),
            window_at::<u64>(bars, s * 8),
        );
        at = ring_next(s, p, slots);
    }
    at
}

/// The consumers' pass over vectors `[begin, end)` of a stage, chunk by chunk from the ring's
/// slot `slot` of phase `phase`: word `j` of a chunk goes to unit `j % CONSUMERS`, which adds it
/// times `xv` to its sum; each plane frees a slot once its units have read it. Returns the unit's
/// sum and the ring's position after the share.
#[cube]
#[allow(clippy::too_many_arguments)]
fn consume_share(
    ring: &[u32],
    bars: &[u64],
    begin: u32,
    end: u32,
    xv: u32,
    slot: u32,
    phase: u32,
    #[comptime] slots: u32,
    #[comptime] chunk: u32,
) -> (u32, u32, u32) {
    let mut acc = 0u32;
    let mut at = (slot, phase);
    for v in range_stepped(begin, end, chunk) {
        let (s, p) = at;
        let words = min(chunk, end - v) * 4u32;
        mbar_wait(window_at::<u64>(bars, s * 8), p);
        let base = (s * chunk * 4) as usize;
        for j in range_stepped(UNIT_POS, words, CONSUMERS) {
            acc += ring[base + j as usize] * xv;
        }
        sync_plane();
        if UNIT_POS_PLANE == 0 {
            let empty = window_at::<u64>(bars, (slots + s) * 8);
            gpu_asm!("mbarrier.arrive.shared::cta.b64 _, [{e}];", e = in(_) empty);
        }
        at = ring_next(s, p, slots);
    }
    let (s, p) = at;
    (acc, s, p)
}

/// Stage `g`'s result of cube `cube` from its consumer units' sums `acc`, in unit 0 (the others
/// get an unspecified value). `part` holds a value a consumer plane.
#[cube]
fn stage_result(acc: u32, part: &mut [u32], g: u32, cube: u32) -> u32 {
    let plane = plane_sum(acc);
    if UNIT_POS_PLANE == 0 {
        part[(UNIT_POS / 32) as usize] = plane;
    }
    consumers_sync();
    let mut total = 0u32;
    #[unroll]
    for p in 0..CONSUMERS / 32 {
        total += part[p as usize];
    }
    total * 2654435761u32 + g + cube
}

/// Holds a persistent kernel's consumers until every cube of stage `g - 1` has released its
/// results (unit 0 acquires the stage's counter, the rest wait at the consumers' barrier); stage
/// 0 waits for nothing.
#[cube]
pub(crate) fn wait_stage(counters: &mut [u32], stages: &[u32], g: u32) {
    if g > 0 {
        if UNIT_POS == 0 {
            let prev = ((g - 1) as usize) * STAGE_WORDS;
            wait_counter(counters, g - 1, stages[prev + CUBES]);
        }
        consumers_sync();
    }
}

/// The end of a persistent kernel's consumers: the last cube to finish zeroes the counters (one
/// a stage and the finishing count after them) for the next launch. Every cube has read every
/// counter it waits on before it counts itself finished.
#[cube]
pub(crate) fn finish_step(counters: &mut [u32], n_stages: u32) {
    if UNIT_POS == 0 {
        let cubes = CUBE_COUNT as u32;
        if add_counter(counters, n_stages, 1u32) == cubes - 1 {
            for i in 0..n_stages + 1 {
                counters[i as usize] = 0u32;
            }
        }
    }
}

/// The producer of a persistent kernel: cube `cube`'s rows of every stage of `stages` it works
/// on, in order, through the ring.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn produce_step(
    weights: &[u32],
    stages: &[u32],
    ring: &[u32],
    bars: &[u64],
    cube: u32,
    #[comptime] slots: u32,
    #[comptime] chunk: u32,
) {
    let mut slot = 0u32;
    let mut phase = 0u32;
    for g in 0..(stages.len() / STAGE_WORDS) as u32 {
        let row = (g as usize) * STAGE_WORDS;
        let cubes = stages[row + CUBES];
        if cube < cubes {
            let k_vectors = stages[row + K_VECTORS];
            let (r0, r1) = row_share(stages[row + ROWS], cubes, cube, stages[row + KIND]);
            let (s, p) = produce_share(
                weights,
                ring,
                bars,
                stages[row + FIRST],
                r0 * k_vectors,
                r1 * k_vectors,
                slot,
                phase,
                slots,
                chunk,
            );
            slot = s;
            phase = p;
        }
    }
}

/// The step: `stages` ([`STAGE_WORDS`] words a stage) of `weights` (16-byte vectors, as u32
/// words), one cube per SM. `y` ([`Y_STRIDE`] sums a stage) holds each working cube's sum, the
/// last stage's being the first stage's input; `counters` one word a stage and one for the cubes
/// that finished, zero at launch and left zero.
#[cube(launch_unchecked)]
pub fn persistent_stream(
    weights: &[u32],
    stages: &[u32],
    y: &mut [u32],
    counters: &mut [u32],
    #[comptime] slots: u32,
    #[comptime] chunk: u32,
) {
    let ring =
        Shared::<[u32]>::new_aligned_slice(comptime![(slots * chunk * 4) as usize], 128usize);
    let bars = Shared::<[u64]>::new_aligned_slice(comptime![(2 * slots) as usize], 8usize);
    let mut part = Shared::<[u32]>::new_slice(comptime![(CONSUMERS / 32) as usize]);
    let n_stages = (stages.len() / STAGE_WORDS) as u32;
    let cube = CUBE_POS as u32;
    let unit = UNIT_POS;
    ring_init(&bars, slots);
    if unit >= CONSUMERS {
        if unit == CONSUMERS {
            produce_step(weights, stages, &ring, &bars, cube, slots, chunk);
        }
    } else {
        // Where the consumers stand in the ring: the next slot and that slot's phase.
        let mut slot = 0u32;
        let mut phase = 0u32;
        for g in 0..n_stages {
            let row = (g as usize) * STAGE_WORDS;
            let pg = select(g > 0, g - 1, n_stages - 1);
            let prev_cubes = stages[(pg as usize) * STAGE_WORDS + CUBES];
            wait_stage(counters, stages, g);
            let xv = load_l2(y, pg * comptime![Y_STRIDE as u32] + unit % prev_cubes) | 1u32;
            let cubes = stages[row + CUBES];
            if cube < cubes {
                let (begin, end) = row_share(stages[row + ROWS], cubes, cube, KIND_PLAIN);
                let (acc, s, p) =
                    consume_share(&ring, &bars, begin, end, xv, slot, phase, slots, chunk);
                slot = s;
                phase = p;
                let total = stage_result(acc, &mut part, g, cube);
                if unit == 0 {
                    y[(g as usize) * Y_STRIDE + cube as usize] = total;
                    // Cumulative: orders this unit's store of the sum before the add.
                    add_counter(counters, g, 1u32);
                }
            }
        }
        finish_step(counters, n_stages);
    }
}

/// One stage (`g`) of the ring chain: one launch a stage, as the step's kernels are now, each
/// with a ring of its own. The launch lets its dependents launch at once, and its producer
/// queues the cube's first chunks before the consumers' `griddepcontrol.wait` for the stage
/// before, so that two stages' cubes share an SM and the next stage's weights stream while this
/// one ends. Same sums as [`persistent_stream()`].
#[cube(launch_unchecked)]
pub fn ring_stage(
    weights: &[u32],
    stages: &[u32],
    y: &mut [u32],
    g: u32,
    #[comptime] slots: u32,
    #[comptime] chunk: u32,
) {
    gpu_asm!("griddepcontrol.launch_dependents;");
    let ring =
        Shared::<[u32]>::new_aligned_slice(comptime![(slots * chunk * 4) as usize], 128usize);
    let bars = Shared::<[u64]>::new_aligned_slice(comptime![(2 * slots) as usize], 8usize);
    let mut part = Shared::<[u32]>::new_slice(comptime![(CONSUMERS / 32) as usize]);
    let n_stages = (stages.len() / STAGE_WORDS) as u32;
    let cube = CUBE_POS as u32;
    let unit = UNIT_POS;
    let row = (g as usize) * STAGE_WORDS;
    let (begin, end) = row_share(stages[row + ROWS], stages[row + CUBES], cube, KIND_PLAIN);
    ring_init(&bars, slots);
    if unit >= CONSUMERS {
        if unit == CONSUMERS {
            // The weights: no kernel writes them, so they need no wait.
            produce_share(
                weights,
                &ring,
                &bars,
                stages[row],
                begin,
                end,
                0u32,
                0u32,
                slots,
                chunk,
            );
        }
    } else {
        gpu_asm!("griddepcontrol.wait;");
        let pg = select(g > 0, g - 1, n_stages - 1);
        let prev_cubes = stages[(pg as usize) * STAGE_WORDS + CUBES];
        let xv = y[(pg as usize) * Y_STRIDE + (unit % prev_cubes) as usize] | 1u32;
        let (acc, _, _) = consume_share(&ring, &bars, begin, end, xv, 0u32, 0u32, slots, chunk);
        let total = stage_result(acc, &mut part, g, cube);
        if unit == 0 {
            y[(g as usize) * Y_STRIDE + cube as usize] = total;
        }
    }
}

/// One stage of the synthetic step: `vectors` 16-byte vectors from vector `first` of the
/// weights, over `cubes` cubes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage {
    pub first: u32,
    pub vectors: u32,
    pub cubes: u32,
}

/// Weight sizes of the synthetic step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sizes {
    /// The 8-bit formats' projections.
    Bits8,
    /// bf16 projections.
    Bf16,
}

impl Sizes {
    pub fn name(self) -> &'static str {
        match self {
            Sizes::Bits8 => "8-bit sizes",
            Sizes::Bf16 => "bf16 sizes",
        }
    }
}

/// Keys and values of a 640-token context a layer: 2 KV heads x 640 x 128 x (K, V) x 2 bytes,
/// in 16-byte vectors.
const KV_VECTORS: u32 = 2 * 640 * 128 * 2 * 2 / 16;

/// The synthetic step's stages on `sms` cubes, laid out one after another from vector 0: per
/// layer qkv, keys and values (16 cubes, as the decode attention's two clusters of eight), o,
/// gate-up and down, each projection with the vectors of the chain's GEMV-like stages (grid x
/// 256 units x vectors a unit).
pub fn step_stages(sizes: Sizes, sms: u32) -> Vec<Stage> {
    let wide = match sizes {
        Sizes::Bits8 => 1,
        Sizes::Bf16 => 2,
    };
    let projections = [(256, 3), (192, 3), (560, 12), (840, 4)]
        .map(|(grid, per_unit)| grid * 256 * per_unit * wide);
    let mut out = Vec::with_capacity(LAYERS * 5);
    let mut first = 0u32;
    let mut push = |vectors: u32, cubes: u32| {
        out.push(Stage {
            first,
            vectors,
            cubes,
        });
        first += vectors;
    };
    for _ in 0..LAYERS {
        push(projections[0], sms);
        push(KV_VECTORS, 16);
        push(projections[1], sms);
        push(projections[2], sms);
        push(projections[3], sms);
    }
    out
}

/// The stage table the kernel reads.
pub fn stage_table(stages: &[Stage]) -> Vec<u32> {
    stages
        .iter()
        .flat_map(|s| [s.first, s.vectors, 1, s.cubes, 0, 0, KIND_PLAIN, 0])
        .collect()
}

/// 16-byte vectors the stages read.
pub fn stage_vectors(stages: &[Stage]) -> usize {
    stages.iter().map(|s| s.vectors as usize).sum()
}

/// `n` pseudo-random weight words (a 32-bit LCG).
pub fn weight_words(n: usize) -> Vec<u32> {
    let mut state = 7u32;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state
        })
        .collect()
}

/// The sums [`persistent_stream()`] stores in one launch from zeroed `y`, for chunks of `chunk`
/// vectors: word `j` of a chunk goes to consumer `j % CONSUMERS`, which multiplies it by its x
/// (the previous stage's sum of cube `unit % cubes`, with its low bit set).
pub fn reference(stages: &[Stage], weights: &[u32], chunk: u32) -> Vec<u32> {
    let n = stages.len();
    let mut y = vec![0u32; n * Y_STRIDE];
    for (g, s) in stages.iter().enumerate() {
        let pg = (g + n - 1) % n;
        let prev_cubes = stages[pg].cubes as usize;
        let xv: Vec<u32> = (0..CONSUMERS as usize)
            .map(|u| y[pg * Y_STRIDE + u % prev_cubes] | 1)
            .collect();
        let per = s.vectors.div_ceil(s.cubes);
        for c in 0..s.cubes {
            let begin = (c * per).min(s.vectors);
            let end = (begin + per).min(s.vectors);
            let mut acc = 0u32;
            for v in begin..end {
                let local = v - begin;
                let within = (local % chunk) as usize * 4;
                let at = (s.first + v) as usize * 4;
                for w in 0..4 {
                    let unit = (within + w) % CONSUMERS as usize;
                    acc = acc.wrapping_add(weights[at + w].wrapping_mul(xv[unit]));
                }
            }
            y[g * Y_STRIDE + c as usize] =
                acc.wrapping_mul(2_654_435_761).wrapping_add(g as u32 + c);
        }
    }
    y
}

/// A ring: `slots` chunks of `chunk` vectors.
#[derive(Clone, Copy, Debug)]
pub struct Ring {
    pub slots: u32,
    pub chunk: u32,
}

/// How the step is launched.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    /// [`persistent_stream()`]: one launch for the step.
    Persistent(Ring),
    /// [`ring_stage()`]: one launch a stage.
    Chain(Ring),
}

impl Variant {
    pub fn ring(self) -> Ring {
        match self {
            Variant::Persistent(r) | Variant::Chain(r) => r,
        }
    }

    pub fn name(self) -> String {
        let r = self.ring();
        let kind = match self {
            Variant::Persistent(_) => "persistent",
            Variant::Chain(_) => "ring chain",
        };
        format!("{kind}, {} x {} KB ring", r.slots, r.chunk * 16 / 1024)
    }
}

const fn ring(slots: u32, chunk: u32) -> Ring {
    Ring { slots, chunk }
}

/// The variants timed: the persistent step with deep rings and with a 2-slot one that cannot run
/// ahead of a stage's wait; the ring chain with rings of 96 KB, so that two stages' cubes fit an
/// SM.
pub const VARIANTS: [Variant; 5] = [
    Variant::Persistent(ring(24, 512)),
    Variant::Persistent(ring(12, 1024)),
    Variant::Persistent(ring(8, 512)),
    Variant::Persistent(ring(2, 512)),
    Variant::Chain(ring(12, 512)),
];

/// The device buffers of one stage list.
pub struct StepBuffers<R: Runtime> {
    pub stages: Vec<Stage>,
    pub table: DeviceTensor<R>,
    pub y: DeviceTensor<R>,
    pub counters: DeviceTensor<R>,
}

impl<R: Runtime> StepBuffers<R> {
    /// The stage table, zeroed sums and zeroed counters.
    pub fn new(client: &ComputeClient<R>, stages: Vec<Stage>) -> ops::Result<Self> {
        let table = stage_table(&stages);
        let n = stages.len();
        Ok(Self {
            table: DeviceTensor::from_slice(client, &table, &[table.len()])?,
            y: DeviceTensor::from_slice(client, &vec![0u32; n * Y_STRIDE], &[n * Y_STRIDE])?,
            counters: DeviceTensor::from_slice(client, &vec![0u32; n + 1], &[n + 1])?,
            stages,
        })
    }
}

/// One step over `weights` (u32 words) as `variant` launches it.
pub fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    weights: &DeviceTensor<R>,
    step: &StepBuffers<R>,
    variant: Variant,
) {
    let Ring { slots, chunk } = variant.ring();
    // SAFETY: every index stays inside its buffer: the stage table's vectors lie within the
    // weights, `y` holds `Y_STRIDE` sums a stage (more than any stage's cubes), `counters` one
    // word a stage and one more.
    unsafe {
        match variant {
            Variant::Persistent(_) => {
                let sms = step.stages.iter().map(|s| s.cubes).max().unwrap_or(1);
                persistent_stream::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(sms, 1, 1),
                    CubeDim::new_1d(CUBE_UNITS),
                    weights.as_buffer_arg(),
                    step.table.as_buffer_arg(),
                    step.y.as_buffer_arg(),
                    step.counters.as_buffer_arg(),
                    slots,
                    chunk,
                );
            }
            Variant::Chain(_) => {
                for (g, s) in step.stages.iter().enumerate() {
                    ring_stage::launch_unchecked::<R>(
                        client,
                        CubeCount::Static(s.cubes, 1, 1),
                        CubeDim::new_1d(CUBE_UNITS),
                        weights.as_buffer_arg(),
                        step.table.as_buffer_arg(),
                        step.y.as_buffer_arg(),
                        g as u32,
                        slots,
                        chunk,
                    );
                }
            }
        }
    }
}

/// Launches `variant` once on `step` as [`StepBuffers::new`] made it (zeroed sums) and compares
/// every working cube's sum with [`reference()`]; the number of sums that differ.
pub fn check<R: Runtime>(
    client: &ComputeClient<R>,
    weights: &DeviceTensor<R>,
    host_weights: &[u32],
    step: &StepBuffers<R>,
    variant: Variant,
) -> ops::Result<usize> {
    launch(client, weights, step, variant);
    let got = words(&step.y.to_bytes(client)?);
    let want = reference(&step.stages, host_weights, variant.ring().chunk);
    let mut bad = 0;
    for (g, s) in step.stages.iter().enumerate() {
        for c in 0..s.cubes as usize {
            bad += usize::from(got[g * Y_STRIDE + c] != want[g * Y_STRIDE + c]);
        }
    }
    Ok(bad)
}

/// Little-endian u32 words of `bytes`.
pub(crate) fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The timed cases whose names contain `filter` (CUDA only, none elsewhere): each variant over
/// each size's step, replayed from a captured graph, after a checked launch (a variant whose
/// sums differ is reported and not timed). A case's time is a whole step (28 layers); its bytes
/// are the weights streamed. Cases left out by the filter are not launched at all, so that a
/// variant that hangs can be run on its own.
pub fn cases<'a, R: Runtime>(client: &'a ComputeClient<R>, filter: &str) -> Vec<Case<'a>> {
    let mut out = Vec::new();
    let wanted: Vec<String> = [Sizes::Bits8, Sizes::Bf16]
        .iter()
        .flat_map(|s| VARIANTS.map(|v| format!("{} {}", s.name(), v.name())))
        .filter(|n| n.contains(filter))
        .collect();
    if wanted.is_empty() {
        return out;
    }
    if !caps::runtime_name(client).contains("cuda") {
        eprintln!("persistent: CUDA only");
        return out;
    }
    let sms = caps::num_sms(client);
    let largest = stage_vectors(&step_stages(Sizes::Bf16, sms));
    let host = weight_words(largest * 4);
    let weights = match DeviceTensor::from_slice(client, &host, &[host.len()]) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("persistent: weights: {e}");
            return out;
        }
    };
    for sizes in [Sizes::Bits8, Sizes::Bf16] {
        let stages = step_stages(sizes, sms);
        let bytes = stage_vectors(&stages) as f64 * 16.0;
        eprintln!(
            "persistent: {}: {:.1} MB a layer, {:.2} us a layer at 3.0 TB/s",
            sizes.name(),
            bytes / LAYERS as f64 / 1e6,
            bytes / LAYERS as f64 / 3.0e6
        );
        for variant in VARIANTS {
            let name = format!("{} {}", sizes.name(), variant.name());
            if !wanted.contains(&name) {
                continue;
            }
            let step = match StepBuffers::new(client, stages.clone()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("persistent: {name}: {e}");
                    continue;
                }
            };
            match check(client, &weights, &host, &step, variant) {
                Ok(0) => eprintln!("persistent: {name}: checked, every sum matches"),
                Ok(bad) => {
                    eprintln!("persistent: {name}: {bad} sums differ, not timed");
                    continue;
                }
                Err(e) => {
                    eprintln!("persistent: {name}: {e}");
                    continue;
                }
            }
            let w = weights.clone();
            let Some(graph) = capture(client, move || launch(client, &w, &step, variant)) else {
                continue;
            };
            out.push(Case {
                name,
                dtype: DType::U32,
                bytes,
                flops: 0.0,
                // SAFETY: the graph's retained handles keep its buffers alive; nothing
                // reallocates them.
                run: Box::new(move || unsafe { graph.replay() }),
            });
        }
    }
    out
}
