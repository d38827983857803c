//! The persistent step with real products: a chain of bf16 GEMVs (M = 1) of the 1.5B decode
//! step's shapes, 28 layers, as one persistent CubeCL kernel fed by the weight ring of
//! [`crate::persistent`]. Where that kernel prices the stream with u32 sums, this one computes
//! each stage's outputs in f32 from the previous stages' outputs, handed on through global
//! memory, so that its time includes reading x, the rows' reductions and the outputs' stores.
//!
//! A stage's rows are dealt out in whole rows over its cubes, so a cube's weights are one
//! contiguous run of bytes. K is a multiple of 256, so every run of 32 vectors (256 weights) that
//! a consumer plane takes from a chunk lies in one row: each lane multiplies 4 words (8 weights)
//! with x from shared memory, the plane sums them, and lane 0 stores the run's sum in the row's
//! slot of a shared table. After the cube's last chunk its units add each row's slots in a fixed
//! order (no atomics, so a replay gives the same bits) and store the row's output.
//!
//! Per layer, as the step: qkv (2 048 x 1 536), a keys-and-values stand-in on 16 cubes (320 x
//! 1 024: the bytes of a 640-token context's keys and values), o (1 536 x 1 536), gate-up (17 920
//! x 1 536) and down (1 536 x 8 960). Each stage waits for the one before; o reads the first 1 536
//! outputs of qkv and down the first 8 960 of gate-up, standing in for the attention and SwiGLU.
//! The first qkv reads a fixed input, so every replay computes the same thing. One launch is
//! checked stage by stage: every output against an f64 product of the stage's weights with the
//! x that the launch itself read.
//!
//! CUDA (sm_90) only, as [`crate::persistent`].

#![allow(clippy::identity_op)]

use bench::{capture, Case};
use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

use crate::persistent::{
    add_counter, consumers_sync, mbar_wait, produce_share, ring_init, ring_next, stage_share,
    wait_counter, window_at, words, Ring, CONSUMERS, CUBE_UNITS, LAYERS,
};

/// u32 words a stage takes in the stage table: first weight vector, rows, K in 16-byte vectors,
/// cubes, x offset, output offset (both in floats of the activations), two unused.
pub const STAGE_WORDS: usize = 8;
/// The most row slots a cube holds: (rows of its share) x (K / 256).
pub const ROW_SLOTS: u32 = 1024;
/// The widest x, in floats.
pub const X_MAX: u32 = 8960;
/// The ring: 20 chunks of 8 KB, which leaves room for x (35 KB) and the row slots.
pub const RING: Ring = Ring {
    slots: 20,
    chunk: 512,
};

/// One stage's products: cube `cube`'s rows of weights streamed through the ring from slot
/// `slot` of phase `phase`, each run of 32 vectors summed by a consumer plane into `row_slots`.
/// Returns the ring's position after the share.
#[cube]
#[allow(clippy::too_many_arguments)]
fn consume_rows(
    ring: &[u32],
    bars: &[u64],
    xs: &[f32],
    row_slots: &mut [f32],
    begin: u32,
    end: u32,
    k_vectors: u32,
    slot: u32,
    phase: u32,
    #[comptime] slots: u32,
    #[comptime] chunk: u32,
) -> (u32, u32) {
    let plane = UNIT_POS / 32;
    let lane = UNIT_POS_PLANE;
    let runs_per_row = k_vectors / 32;
    let mut at = (slot, phase);
    for v in range_stepped(begin, end, chunk) {
        let (s, p) = at;
        let runs = min(chunk, end - v) / 32;
        mbar_wait(window_at::<u64>(bars, s * 8), p);
        let base = s * chunk * 4;
        for run in range_stepped(plane, runs, comptime![CONSUMERS / 32]) {
            let local = v - begin + run * 32;
            let row = local / k_vectors;
            let seg = (local % k_vectors) / 32;
            // The run's first weight's column.
            let col0 = (local % k_vectors) * 8;
            let mut acc = 0f32;
            #[unroll]
            for k in 0..4u32 {
                let pair = lane + k * 32;
                let word = ring[(base + run * 128 + pair) as usize];
                let col = (col0 + pair * 2) as usize;
                acc += f32::reinterpret(word << 16u32) * xs[col];
                acc += f32::reinterpret(word & 0xffff0000u32) * xs[col + 1];
            }
            let sum = plane_sum(acc);
            if lane == 0 {
                row_slots[(row * runs_per_row + seg) as usize] = sum;
            }
        }
        sync_plane();
        if lane == 0 {
            let empty = window_at::<u64>(bars, (slots + s) * 8);
            gpu_asm!("mbarrier.arrive.shared::cta.b64 _, [{e}];", e = in(_) empty);
        }
        at = ring_next(s, p, slots);
    }
    at
}

/// The chain of GEMVs: `stages` ([`STAGE_WORDS`] words a stage) over `weights` (bf16 pairs as
/// u32 words, rows of K weights), reading x from and storing outputs to `acts`. One cube per SM;
/// `counters` as [`crate::persistent::persistent_stream`]'s.
#[cube(launch_unchecked)]
pub fn persistent_gemv(
    weights: &[u32],
    stages: &[u32],
    acts: &mut [f32],
    counters: &mut [u32],
    #[comptime] slots: u32,
    #[comptime] chunk: u32,
) {
    let ring =
        Shared::<[u32]>::new_aligned_slice(comptime![(slots * chunk * 4) as usize], 128usize);
    let bars = Shared::<[u64]>::new_aligned_slice(comptime![(2 * slots) as usize], 8usize);
    let mut xs = Shared::<[f32]>::new_aligned_slice(comptime![X_MAX as usize], 16usize);
    let mut row_slots = Shared::<[f32]>::new_slice(comptime![ROW_SLOTS as usize]);
    let n_stages = (stages.len() / STAGE_WORDS) as u32;
    let cube = CUBE_POS as u32;
    let unit = UNIT_POS;
    ring_init(&bars, slots);
    let mut slot = 0u32;
    let mut phase = 0u32;
    if unit >= CONSUMERS {
        if unit == CONSUMERS {
            for g in 0..n_stages {
                let row = (g as usize) * STAGE_WORDS;
                let cubes = stages[row + 3];
                if cube < cubes {
                    let k_vectors = stages[row + 2];
                    let (r0, r1) = stage_share(stages[row + 1], cubes, cube);
                    let (s, p) = produce_share(
                        weights,
                        &ring,
                        &bars,
                        stages[row],
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
    } else {
        for g in 0..n_stages {
            let row = (g as usize) * STAGE_WORDS;
            if g > 0 {
                if unit == 0 {
                    let prev = ((g - 1) as usize) * STAGE_WORDS;
                    wait_counter(counters, g - 1, stages[prev + 3]);
                }
                consumers_sync();
            }
            let cubes = stages[row + 3];
            if cube < cubes {
                let k_vectors = stages[row + 2];
                let x_off = stages[row + 4] as usize;
                let y_off = stages[row + 5] as usize;
                // Ordered after the stage before by unit 0's acquire and the barrier.
                for i in range_stepped(unit, k_vectors * 8, CONSUMERS) {
                    xs[i as usize] = acts[x_off + i as usize];
                }
                consumers_sync();
                let (r0, r1) = stage_share(stages[row + 1], cubes, cube);
                let (s, p) = consume_rows(
                    &ring,
                    &bars,
                    &xs,
                    &mut row_slots,
                    r0 * k_vectors,
                    r1 * k_vectors,
                    k_vectors,
                    slot,
                    phase,
                    slots,
                    chunk,
                );
                slot = s;
                phase = p;
                consumers_sync();
                let runs_per_row = k_vectors / 32;
                for r in range_stepped(unit, r1 - r0, CONSUMERS) {
                    let mut total = 0f32;
                    for q in 0..runs_per_row {
                        total += row_slots[(r * runs_per_row + q) as usize];
                    }
                    acts[y_off + (r0 + r) as usize] = total;
                }
                // Every unit's stores, and its reads of x and of the row slots, come before the
                // add (cumulative release); the next stage's x may then overwrite the slots.
                consumers_sync();
                if unit == 0 {
                    add_counter(counters, g, 1u32);
                }
            }
        }
        if unit == 0 {
            let cubes = CUBE_COUNT as u32;
            if add_counter(counters, n_stages, 1u32) == cubes - 1 {
                for i in 0..n_stages + 1 {
                    counters[i as usize] = 0u32;
                }
            }
        }
    }
}

/// One GEMV stage: `rows` x `k` bf16 weights from vector `first` of the weights, over `cubes`
/// cubes, reading x at float `x_off` of the activations and storing its outputs at `y_off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvStage {
    pub first: u32,
    pub rows: u32,
    pub k: u32,
    pub cubes: u32,
    pub x_off: u32,
    pub y_off: u32,
}

/// Floats of the activations: offsets are rounded up to 32 floats (a 128-byte line), so that no
/// line holds two stages' outputs.
fn line_up(n: u32) -> u32 {
    n.div_ceil(32) * 32
}

/// The stages of [`persistent_gemv`] on `sms` cubes and the activations' length in floats (the
/// input first, then every stage's outputs).
pub fn gemv_stages(sms: u32) -> (Vec<GemvStage>, u32) {
    let mut out = Vec::with_capacity(LAYERS * 5);
    let mut first = 0u32;
    let mut acts = line_up(1536);
    let mut x = 0u32;
    let mut push = |rows: u32, k: u32, cubes: u32, x_off: u32| -> u32 {
        let y_off = acts;
        out.push(GemvStage {
            first,
            rows,
            k,
            cubes,
            x_off,
            y_off,
        });
        first += rows * k / 8;
        acts += line_up(rows);
        y_off
    };
    for _ in 0..LAYERS {
        let qkv_out = push(2048, 1536, sms, x);
        push(320, 1024, 16, qkv_out);
        let o_out = push(1536, 1536, sms, qkv_out);
        let gate_up = push(17920, 1536, sms, o_out);
        x = push(1536, 8960, sms, gate_up);
    }
    (out, acts)
}

/// The stage table the kernel reads.
pub fn gemv_table(stages: &[GemvStage]) -> Vec<u32> {
    stages
        .iter()
        .flat_map(|s| [s.first, s.rows, s.k / 8, s.cubes, s.x_off, s.y_off, 0, 0])
        .collect()
}

/// Why a stage list does not fit the kernel, if it does not.
pub fn gemv_unfit(stages: &[GemvStage]) -> Option<String> {
    stages.iter().find_map(|s| {
        let per = s.rows.div_ceil(s.cubes);
        if s.k % 256 != 0 || s.k > X_MAX {
            Some(format!("K = {} (a multiple of 256 up to {X_MAX})", s.k))
        } else if per * s.k / 256 > ROW_SLOTS {
            Some(format!(
                "{per} rows of {} a cube need more than {ROW_SLOTS} row slots",
                s.k
            ))
        } else {
            None
        }
    })
}

/// `n` bf16 weights (as u32 pairs, low half first) uniform in about +-sqrt(3 / k), so that
/// every stage's outputs stay of the order of its inputs.
pub fn bf16_weight_words(stages: &[GemvStage], n_words: usize) -> Vec<u32> {
    let mut out = vec![0u32; n_words];
    let mut state = 11u32;
    let mut next = |scale: f32| {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let u = (state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0;
        ((u * scale).to_bits() >> 16) & 0xffff
    };
    for s in stages {
        let scale = (3.0 / s.k as f32).sqrt();
        let start = s.first as usize * 4;
        for w in &mut out[start..start + (s.rows * s.k / 2) as usize] {
            *w = next(scale) | (next(scale) << 16);
        }
    }
    out
}

fn bf16_lo(w: u32) -> f64 {
    f32::from_bits(w << 16) as f64
}

fn bf16_hi(w: u32) -> f64 {
    f32::from_bits(w & 0xffff_0000) as f64
}

/// Checks one launch's activations stage by stage: each output against the f64 product of the
/// stage's weights with the x the launch read. The worst relative error over the stages (error
/// over the largest output of the stage).
pub fn gemv_check(stages: &[GemvStage], weights: &[u32], acts: &[f32]) -> f64 {
    let mut worst = 0f64;
    for s in stages {
        let x = &acts[s.x_off as usize..(s.x_off + s.k) as usize];
        let mut err = 0f64;
        let mut scale = 0f64;
        for r in 0..s.rows as usize {
            let row = &weights[s.first as usize * 4 + r * s.k as usize / 2..][..s.k as usize / 2];
            let want: f64 = row
                .iter()
                .enumerate()
                .map(|(i, &w)| bf16_lo(w) * x[2 * i] as f64 + bf16_hi(w) * x[2 * i + 1] as f64)
                .sum();
            err = err.max((acts[s.y_off as usize + r] as f64 - want).abs());
            scale = scale.max(want.abs());
        }
        worst = worst.max(err / scale.max(1e-30));
    }
    worst
}

/// The largest relative error [`gemv_check`] accepts: f32 sums of up to 8 960 products.
pub const GEMV_TOLERANCE: f64 = 1e-4;

/// The timed case (CUDA only): the chain replayed from a captured graph after one checked
/// launch. Its time is a whole step (28 layers); its bytes are the weights streamed.
pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    if !caps::runtime_name(client).contains("cuda") {
        eprintln!("persistent gemv: CUDA only");
        return out;
    }
    let sms = caps::num_sms(client);
    let (stages, acts_len) = gemv_stages(sms);
    if let Some(why) = gemv_unfit(&stages) {
        eprintln!("persistent gemv: {why}");
        return out;
    }
    let vectors: usize = stages.iter().map(|s| (s.rows * s.k / 8) as usize).sum();
    let host = bf16_weight_words(&stages, vectors * 4);
    let table = gemv_table(&stages);
    let mut input = vec![0f32; acts_len as usize];
    for (i, v) in input.iter_mut().take(1536).enumerate() {
        *v = ((i * 37 % 101) as f32 - 50.0) / 50.0;
    }
    let n = stages.len();
    let buffers = (|| -> ops::Result<_> {
        Ok((
            DeviceTensor::from_slice(client, &host, &[host.len()])?,
            DeviceTensor::from_slice(client, &table, &[table.len()])?,
            DeviceTensor::from_slice(client, &input, &[input.len()])?,
            DeviceTensor::from_slice(client, &vec![0u32; n + 1], &[n + 1])?,
        ))
    })();
    let (weights, table, acts, counters) = match buffers {
        Ok(b) => b,
        Err(e) => {
            eprintln!("persistent gemv: {e}");
            return out;
        }
    };
    let acts_out = acts.clone();
    let launch = move || {
        // SAFETY: the table's weights, x and outputs lie inside their buffers (built together
        // above), `counters` has a word a stage and one more.
        unsafe {
            persistent_gemv::launch_unchecked::<R>(
                client,
                CubeCount::Static(sms, 1, 1),
                CubeDim::new_1d(CUBE_UNITS),
                weights.as_buffer_arg(),
                table.as_buffer_arg(),
                acts.as_buffer_arg(),
                counters.as_buffer_arg(),
                RING.slots,
                RING.chunk,
            );
        }
    };
    launch();
    let got = match acts_out.to_bytes(client) {
        Ok(b) => words(&b)
            .into_iter()
            .map(f32::from_bits)
            .collect::<Vec<_>>(),
        Err(e) => {
            eprintln!("persistent gemv: {e}");
            return out;
        }
    };
    let worst = gemv_check(&stages, &host, &got);
    let name = format!(
        "persistent gemv bf16, {} x {} KB ring",
        RING.slots,
        RING.chunk * 16 / 1024
    );
    if worst.is_nan() || worst > GEMV_TOLERANCE {
        eprintln!("persistent gemv: {name}: relative error {worst:.2e} over {GEMV_TOLERANCE:.0e}, not timed");
        return out;
    }
    eprintln!("persistent gemv: {name}: checked, worst relative error {worst:.2e}");
    let Some(graph) = capture(client, launch) else {
        return out;
    };
    out.push(Case {
        name,
        dtype: DType::BF16,
        bytes: vectors as f64 * 16.0,
        flops: 2.0 * vectors as f64 * 8.0,
        // SAFETY: the graph's retained handles keep its buffers alive; nothing reallocates them.
        run: Box::new(move || unsafe { graph.replay() }),
    });
    out
}
