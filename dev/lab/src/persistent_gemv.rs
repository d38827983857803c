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
//! x 1 536) and down (1 536 x 8 960); each stage waits for the one before. Two chains:
//!
//! - the GEMVs alone ([`gemv_stages`]): o reads the first 1 536 outputs of qkv and down the first
//!   8 960 of gate-up, standing in for the attention and SwiGLU;
//! - the layers' dense math ([`layer_stages`]): the RMS norms recomputed by every cube of qkv and
//!   gate-up from the residual stream, qkv's bias, the residual adds of o and down, and SwiGLU
//!   from gate-up's (gate, up) row pairs, dealt out whole; o still reads qkv's outputs in place
//!   of the attention's.
//!
//! The first stage reads a fixed input, so every replay computes the same thing. One launch is
//! checked stage by stage: every output against an f64 reference computed from what the launch
//! itself read (x, norm weights, bias, residual).
//!
//! CUDA (sm_90) only, as [`crate::persistent`].

#![allow(clippy::identity_op)]

use bench::{capture, Case};
use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

use crate::persistent::{
    add_counter, consumers_sync, finish_step, mbar_wait, produce_step, ring_init, ring_next,
    row_share, wait_stage, window_at, words, Ring, AUX, CONSUMERS, CUBES, CUBE_UNITS, KIND,
    K_VECTORS, LAYERS, ROWS, X_OFF, Y_OFF,
};
pub use crate::persistent::{
    KIND_NORM_BIAS, KIND_NORM_SWIGLU, KIND_PLAIN, KIND_RESIDUAL, NORM_EPS, STAGE_WORDS,
};

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

/// Row `r`'s sum from its `runs` slots, in a fixed order.
#[cube]
fn row_total(row_slots: &[f32], r: u32, runs: u32) -> f32 {
    let mut total = 0f32;
    for q in 0..runs {
        total += row_slots[(r * runs + q) as usize];
    }
    total
}

/// The chain of GEMVs: `stages` ([`STAGE_WORDS`] words a stage) over `weights` (bf16 pairs as
/// u32 words, rows of K weights), reading x from and storing outputs to `acts`. One cube per SM;
/// `counters` as [`crate::persistent::persistent_stream()`]'s.
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
    let mut part = Shared::<[f32]>::new_slice(comptime![(CONSUMERS / 32) as usize]);
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
            wait_stage(counters, stages, g);
            let cubes = stages[row + CUBES];
            if cube < cubes {
                let k_vectors = stages[row + K_VECTORS];
                let k = k_vectors * 8;
                let x_off = stages[row + X_OFF] as usize;
                let y_off = stages[row + Y_OFF] as usize;
                let kind = stages[row + KIND];
                let aux = stages[row + AUX] as usize;
                // Ordered after the stage before by unit 0's acquire and the barrier.
                for i in range_stepped(unit, k, CONSUMERS) {
                    xs[i as usize] = acts[x_off + i as usize];
                }
                if kind == KIND_NORM_BIAS || kind == KIND_NORM_SWIGLU {
                    // Each unit squares the elements it stored; the cube adds the planes' sums.
                    let mut squares = 0f32;
                    for i in range_stepped(unit, k, CONSUMERS) {
                        let v = xs[i as usize];
                        squares += v * v;
                    }
                    let plane = plane_sum(squares);
                    if UNIT_POS_PLANE == 0 {
                        part[(unit / 32) as usize] = plane;
                    }
                    consumers_sync();
                    let mut total = 0f32;
                    #[unroll]
                    for q in 0..CONSUMERS / 32 {
                        total += part[q as usize];
                    }
                    let inv = 1f32 / f32::sqrt(total / f32::cast_from(k) + NORM_EPS);
                    for i in range_stepped(unit, k, CONSUMERS) {
                        xs[i as usize] = xs[i as usize] * inv * acts[aux + i as usize];
                    }
                }
                consumers_sync();
                let (r0, r1) = row_share(stages[row + ROWS], cubes, cube, kind);
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
                if kind == KIND_NORM_SWIGLU {
                    for pr in range_stepped(unit, (r1 - r0) / 2, CONSUMERS) {
                        let gate = row_total(&row_slots, 2 * pr, runs_per_row);
                        let up = row_total(&row_slots, 2 * pr + 1, runs_per_row);
                        acts[y_off + (r0 / 2 + pr) as usize] = gate / (1f32 + f32::exp(-gate)) * up;
                    }
                } else {
                    for r in range_stepped(unit, r1 - r0, CONSUMERS) {
                        let mut total = row_total(&row_slots, r, runs_per_row);
                        if kind == KIND_NORM_BIAS {
                            total += acts[aux + (k + r0 + r) as usize];
                        }
                        if kind == KIND_RESIDUAL {
                            total += acts[aux + (r0 + r) as usize];
                        }
                        acts[y_off + (r0 + r) as usize] = total;
                    }
                }
                // Every unit's stores, and its reads of x and of the row slots, come before the
                // add (cumulative release); the next stage's x may then overwrite the slots.
                consumers_sync();
                if unit == 0 {
                    add_counter(counters, g, 1u32);
                }
            }
        }
        finish_step(counters, n_stages);
    }
}

/// One GEMV stage: `rows` x `k` bf16 weights from vector `first` of the weights, over `cubes`
/// cubes, reading x at float `x_off` of the activations and storing its outputs at `y_off`, with
/// the epilogue of `kind` (a `KIND_*`), whose norm weights, bias or residual are at `aux`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvStage {
    pub first: u32,
    pub rows: u32,
    pub k: u32,
    pub cubes: u32,
    pub x_off: u32,
    pub y_off: u32,
    pub kind: u32,
    pub aux: u32,
}

impl GemvStage {
    /// The outputs it stores: one a (gate, up) pair for [`KIND_NORM_SWIGLU`], one a row
    /// otherwise.
    pub fn outputs(&self) -> u32 {
        if self.kind == KIND_NORM_SWIGLU {
            self.rows / 2
        } else {
            self.rows
        }
    }

    /// Rows of the largest cube's share.
    pub fn rows_per_cube(&self) -> u32 {
        if self.kind == KIND_NORM_SWIGLU {
            (self.rows / 2).div_ceil(self.cubes) * 2
        } else {
            self.rows.div_ceil(self.cubes)
        }
    }
}

/// Floats of the activations: offsets are rounded up to 32 floats (a 128-byte line), so that no
/// line holds two regions.
fn line_up(n: u32) -> u32 {
    n.div_ceil(32) * 32
}

/// The activations being laid out: their initial values (inputs and parameters, zeros where
/// outputs go) and the weights' next vector.
struct Layout {
    acts: Vec<f32>,
    first: u32,
    stages: Vec<GemvStage>,
}

impl Layout {
    fn new() -> Self {
        Self {
            acts: Vec::new(),
            first: 0,
            stages: Vec::new(),
        }
    }

    /// A region of `values`, at a line's start; its offset.
    fn region(&mut self, values: impl IntoIterator<Item = f32>) -> u32 {
        let at = self.acts.len() as u32;
        self.acts.extend(values);
        let end = line_up(self.acts.len() as u32) as usize;
        self.acts.resize(end, 0.0);
        at
    }

    /// A stage of `rows` x `k` weights; the offset of its outputs.
    fn stage(&mut self, rows: u32, k: u32, cubes: u32, x_off: u32, kind: u32, aux: u32) -> u32 {
        let mut stage = GemvStage {
            first: self.first,
            rows,
            k,
            cubes,
            x_off,
            y_off: 0,
            kind,
            aux,
        };
        stage.y_off = self.region(std::iter::repeat_n(0.0, stage.outputs() as usize));
        self.first += rows * k / 8;
        self.stages.push(stage);
        stage.y_off
    }
}

/// `n` values from `seed` spread over `center` +- `spread`.
fn spread(n: usize, seed: usize, center: f32, spread: f32) -> impl Iterator<Item = f32> {
    (0..n).map(move |i| center + spread * (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 50.0)
}

/// A stage list, the activations' initial values (the first stage's input, the norms' weights
/// and the biases; zeros where outputs go).
pub type Chain = (Vec<GemvStage>, Vec<f32>);

/// The GEMVs alone on `sms` cubes: per layer qkv, the keys-and-values stand-in (16 cubes), o,
/// gate-up and down, each reading the output of the one before it (o the first 1 536 of qkv's,
/// down the first 8 960 of gate-up's).
pub fn gemv_stages(sms: u32) -> Chain {
    let mut l = Layout::new();
    let mut x = l.region(spread(1536, 0, 0.0, 1.0));
    for _ in 0..LAYERS {
        let qkv = l.stage(2048, 1536, sms, x, KIND_PLAIN, 0);
        l.stage(320, 1024, 16, qkv, KIND_PLAIN, 0);
        let o = l.stage(1536, 1536, sms, qkv, KIND_PLAIN, 0);
        let gate_up = l.stage(17920, 1536, sms, o, KIND_PLAIN, 0);
        x = l.stage(1536, 8960, sms, gate_up, KIND_PLAIN, 0);
    }
    (l.stages, l.acts)
}

/// The layers' dense math on `sms` cubes: per layer the RMS norm and qkv with its bias, the
/// keys-and-values stand-in (16 cubes), o with the residual (reading the first 1 536 of qkv's
/// outputs in place of the attention's), the RMS norm and gate-up with SwiGLU, and down with the
/// residual.
pub fn layer_stages(sms: u32) -> Chain {
    let mut l = Layout::new();
    let mut h = l.region(spread(1536, 0, 0.0, 1.0));
    for layer in 0..LAYERS {
        let attn_norm = l.region(spread(1536, 3 * layer + 1, 1.0, 0.5));
        l.region(spread(2048, 3 * layer + 2, 0.0, 0.2));
        let mlp_norm = l.region(spread(1536, 3 * layer + 3, 1.0, 0.5));
        let qkv = l.stage(2048, 1536, sms, h, KIND_NORM_BIAS, attn_norm);
        l.stage(320, 1024, 16, qkv, KIND_PLAIN, 0);
        let o = l.stage(1536, 1536, sms, qkv, KIND_RESIDUAL, h);
        let act = l.stage(17920, 1536, sms, o, KIND_NORM_SWIGLU, mlp_norm);
        h = l.stage(1536, 8960, sms, act, KIND_RESIDUAL, o);
    }
    (l.stages, l.acts)
}

/// The stage table the kernel reads.
pub fn gemv_table(stages: &[GemvStage]) -> Vec<u32> {
    stages
        .iter()
        .flat_map(|s| {
            [
                s.first,
                s.rows,
                s.k / 8,
                s.cubes,
                s.x_off,
                s.y_off,
                s.kind,
                s.aux,
            ]
        })
        .collect()
}

/// Why a stage list does not fit the kernel, if it does not.
pub fn gemv_unfit(stages: &[GemvStage]) -> Option<String> {
    stages.iter().find_map(|s| {
        let per = s.rows_per_cube();
        if s.k % 256 != 0 || s.k > X_MAX {
            Some(format!("K = {} (a multiple of 256 up to {X_MAX})", s.k))
        } else if per * s.k / 256 > ROW_SLOTS {
            Some(format!(
                "{per} rows of {} a cube need more than {ROW_SLOTS} row slots",
                s.k
            ))
        } else if s.kind == KIND_NORM_SWIGLU && s.rows % 2 != 0 {
            Some(format!("{} gate-up rows (pairs)", s.rows))
        } else {
            None
        }
    })
}

/// `n_words` words of bf16 weights (as u32 pairs, low half first) uniform in about
/// +-sqrt(3 / k) for each stage's rows, so that its outputs stay of the order of its inputs.
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

/// What stage `s` should have stored, in f64, from the activations `acts` that a launch left
/// (its own x, norm weights, bias and residual).
pub fn stage_reference(s: &GemvStage, weights: &[u32], acts: &[f32]) -> Vec<f64> {
    let k = s.k as usize;
    let aux = s.aux as usize;
    let mut x: Vec<f64> = acts[s.x_off as usize..][..k]
        .iter()
        .map(|&v| v as f64)
        .collect();
    if s.kind == KIND_NORM_BIAS || s.kind == KIND_NORM_SWIGLU {
        let mean = x.iter().map(|v| v * v).sum::<f64>() / k as f64;
        let inv = 1.0 / (mean + NORM_EPS as f64).sqrt();
        for (i, v) in x.iter_mut().enumerate() {
            *v *= inv * acts[aux + i] as f64;
        }
    }
    let products: Vec<f64> = (0..s.rows as usize)
        .map(|r| {
            weights[s.first as usize * 4 + r * k / 2..][..k / 2]
                .iter()
                .enumerate()
                .map(|(i, &w)| bf16_lo(w) * x[2 * i] + bf16_hi(w) * x[2 * i + 1])
                .sum()
        })
        .collect();
    match s.kind {
        KIND_NORM_BIAS => (0..products.len())
            .map(|r| products[r] + acts[aux + k + r] as f64)
            .collect(),
        KIND_RESIDUAL => (0..products.len())
            .map(|r| products[r] + acts[aux + r] as f64)
            .collect(),
        KIND_NORM_SWIGLU => products
            .chunks_exact(2)
            .map(|p| p[0] / (1.0 + (-p[0]).exp()) * p[1])
            .collect(),
        _ => products,
    }
}

/// Checks one launch's activations stage by stage against [`stage_reference`]: the worst
/// relative error over the stages (error over the largest expected output of the stage).
pub fn gemv_check(stages: &[GemvStage], weights: &[u32], acts: &[f32]) -> f64 {
    let mut worst = 0f64;
    for s in stages {
        let want = stage_reference(s, weights, acts);
        let got = &acts[s.y_off as usize..][..want.len()];
        let err = want
            .iter()
            .zip(got)
            .map(|(w, &g)| (g as f64 - w).abs())
            .fold(0f64, f64::max);
        let scale = want.iter().map(|w| w.abs()).fold(0f64, f64::max);
        worst = worst.max(err / scale.max(1e-30));
    }
    worst
}

/// The largest relative error [`gemv_check`] accepts: f32 sums of up to 8 960 products.
pub const GEMV_TOLERANCE: f64 = 1e-4;

/// The chain `name` (stages and initial activations) as a timed case: replayed from a captured
/// graph after one launch that [`gemv_check`] accepts. Its time is a whole step (28 layers); its
/// bytes are the weights streamed.
fn chain_case<'a, R: Runtime>(
    client: &'a ComputeClient<R>,
    name: String,
    chain: Chain,
) -> Result<Case<'a>, String> {
    let (stages, initial) = chain;
    let sms = stages.iter().map(|s| s.cubes).max().unwrap_or(1);
    if let Some(why) = gemv_unfit(&stages) {
        return Err(why);
    }
    let vectors: usize = stages.iter().map(|s| (s.rows * s.k / 8) as usize).sum();
    let host = bf16_weight_words(&stages, vectors * 4);
    let table = gemv_table(&stages);
    let n = stages.len();
    let upload = || -> ops::Result<_> {
        Ok((
            DeviceTensor::from_slice(client, &host, &[host.len()])?,
            DeviceTensor::from_slice(client, &table, &[table.len()])?,
            DeviceTensor::from_slice(client, &initial, &[initial.len()])?,
            DeviceTensor::from_slice(client, &vec![0u32; n + 1], &[n + 1])?,
        ))
    };
    let (weights, table, acts, counters) = upload().map_err(|e| e.to_string())?;
    let acts_out = acts.clone();
    let launch = move || {
        // SAFETY: the table's weights, x, parameters and outputs lie inside their buffers
        // (laid out together), `counters` has a word a stage and one more.
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
    let got: Vec<f32> = words(&acts_out.to_bytes(client).map_err(|e| e.to_string())?)
        .into_iter()
        .map(f32::from_bits)
        .collect();
    let worst = gemv_check(&stages, &host, &got);
    if worst.is_nan() || worst > GEMV_TOLERANCE {
        return Err(format!(
            "relative error {worst:.2e} over {GEMV_TOLERANCE:.0e}, not timed"
        ));
    }
    eprintln!("persistent: {name}: checked, worst relative error {worst:.2e}");
    let graph = capture(client, launch).ok_or("the graph capture failed")?;
    Ok(Case {
        name,
        dtype: DType::BF16,
        bytes: vectors as f64 * 16.0,
        flops: 2.0 * vectors as f64 * 8.0,
        // SAFETY: the graph's retained handles keep its buffers alive; nothing reallocates them.
        run: Box::new(move || unsafe { graph.replay() }),
    })
}

/// The timed cases whose names contain `filter` (CUDA only): the GEMVs alone and the layers'
/// dense math, each on the ring [`RING`]; those left out by the filter are not launched.
pub fn cases<'a, R: Runtime>(client: &'a ComputeClient<R>, filter: &str) -> Vec<Case<'a>> {
    let mut out = Vec::new();
    let ring = format!("{} x {} KB ring", RING.slots, RING.chunk * 16 / 1024);
    let name = |what: &str| format!("persistent {what} bf16, {ring}");
    if !["gemv chain", "layer math"]
        .iter()
        .any(|w| name(w).contains(filter))
    {
        return out;
    }
    if !caps::runtime_name(client).contains("cuda") {
        eprintln!("persistent gemv: CUDA only");
        return out;
    }
    let sms = caps::num_sms(client);
    for (what, chain) in [
        ("gemv chain", gemv_stages as fn(u32) -> Chain),
        ("layer math", layer_stages),
    ] {
        let name = name(what);
        if !name.contains(filter) {
            continue;
        }
        match chain_case(client, name.clone(), chain(sms)) {
            Ok(case) => out.push(case),
            Err(e) => eprintln!("persistent: {name}: {e}"),
        }
    }
    out
}
