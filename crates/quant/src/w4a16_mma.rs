//! The int4 decode GEMV on the tensor cores (CUDA, bf16 and f16 activations, M <= 16): the same
//! `[N, K/8]` weight as [`crate::w4a16_nk`], the same fused input norm and epilogue.
//!
//! The CUDA-core GEMV spends about three instructions per weight (the nibble's decoding, one FMA,
//! the x operand from shared memory), which at the 1.5B model's shapes keeps it at a third of the
//! memory bandwidth. Here two nibbles (positions `p` and `p + 4` of a word) become an exact bf16
//! (f16) pair in a shift and one LOP3 (`(w >> 4p) & 0x000F000F ^ magic` is `136 + n` in both
//! halves, as bf16), and `mma.sync.m16n8k16` multiplies them with x. In bf16 the offset stays
//! in the weights: a step's sums lose `136 · Σx` over its k (x's sums per step are taken while x
//! is staged), one FMA per output instead of a packed FMA per weight pair. In f16, whose pairs
//! are `1032 + n`, that subtraction would cancel 8x more bits, so each pair takes the packed
//! FMA `v · 1 - 1032`.
//!
//! Layout of the work: the weight is the MMA's A operand (a tile is 16 weight rows = 16 output
//! columns), x its B operand (column `c` is x row `c`; above 8 rows a second MMA takes rows
//! 8..16). At one row of x a B column carries the product and an A element is one weight, so
//! each 8-nibble word is one MMA (with the weight as the 8-column B operand, two were needed for
//! the same 8 weights). A step is 128 k: each lane of a quad loads 16 bytes (32 k) of its weight
//! rows `gid` and `gid + 8`, so a warp reads 16 rows x 64 bytes, whole sectors. Within a step the
//! MMA's k order is a permutation of the physical k, the same for x, which is staged in shared
//! memory in that order as packed pairs (word `i` of a row: `(x0, x4), (x1, x5), (x2, x6),
//! (x3, x7)` of k = 8i..), so the dot products are unchanged: nibble pair `2h` of a word is the
//! A fragment's k `(2 tig, 2 tig + 1)` and staged pair `2h` the same k of B, pair `2h + 1` k
//! `(2 tig + 8, 2 tig + 9)`.
//!
//! Each step's MMAs start from zero and their sum is scaled by the step's group scale into f32
//! accumulators, so groups must be whole steps (a multiple of 128, or one per output channel).
//! The warps of a tile split the steps and meet in shared memory; bias, residual and the gated
//! activation follow as in the dense kernels. x is staged whole where it fits the stage (every
//! one-row launch of the 1.5B model, 16 rows at K = 1 536); larger M x K is staged in chunks of
//! whole passes, each multiplied before the next is staged, so any M up to 16 runs here.

use cubecl::prelude::*;
use ops::gemm::EpilogueBlueprint;
use ops::norm::{cube_inv_rms, row_inv_rms, scale_by_weight, sum_squares};
use ops::reduce::ReducePlan;
use ops::{caps, DType, DeviceTensor, Result};

use crate::tile_sums::{stash_tile_sums, write_tile_sums, TileSums};
use crate::w4a16_fragments::{has_mma16, mma_m16n8k16, nibble_pair, pack_pair};
use crate::w4a16_nk::NkEpilogue;

mod shape;
use shape::LaunchShape;
pub(crate) use shape::{tile_warps, SmDevice};
#[cfg(test)]
mod cuda_source;

/// K per step: a quad's four lanes x 32.
const STEP_K: usize = 128;
/// Most bytes of shared memory the staged x rows take (M x K padded to whole steps x 2 bytes):
/// one row needs 17.5 KB at the 1.5B model's down projection, 28 KB at K = 14336, 16 rows at
/// its hidden size 48 KB. Larger M x K (16 rows of the down projection, 280 KB) is staged in
/// chunks of whole passes. On an H200 at 16 rows a 28 KB stage (the down projection in 18
/// chunks of 4 steps, on 4-warp tiles) took 109 µs where the CUDA-core GEMV took 78.
pub(crate) const STAGE_MAX_BYTES: usize = 64 * 1024;
/// Bytes of the warps' partial sums at most: 16 warps of 16 columns x 8 x rows, gated (above 8
/// rows of x, 8 warps of twice as many).
pub(crate) const RED_MAX_BYTES: usize = MAX_WARPS * 128 * 2 * 4;
/// Warps per SM the launch aims for (the warps of a tile split its steps).
pub(crate) const WARPS_PER_SM: usize = 32;
/// Most warps per tile (a cube of 512 units).
pub(crate) const MAX_WARPS: usize = 16;
/// 16-byte weight loads a lane issues before the first is used (two rows per step, and two more
/// when gated). On an H200 at the 1.5B shape, 16 against 8 decoded W4A16 about 1.4% faster
/// (medians of two runs in one call: 1 048.3 against 1 035.9 tok/s).
const MAX_LOADS: usize = 16;
/// Output columns per tile: the MMA's 16 A rows. The 1.5B model's o and down projections (1 536
/// columns) then have 96 tiles, fewer than an H100's or H200's 132 SMs; tiles of 8 weight rows
/// with the next step in the A fragment's rows 8..16 (and x's two steps in B's columns 0 and 1)
/// gave every SM work there but decoded no faster on an H200 (1 063 against 1 071 tok/s).
pub(crate) const TILE_N: usize = 16;
/// Fewest warps per cube: tiles of fewer warps share a cube, which stages x (and reduces its
/// norm) once for all of them. Measured with tiles of 8 columns at the 1.5B model's gate-up
/// projection (1 120 tiles of 4 warps): cubes of 8 warps (two tiles) decoded W4A16 3.4% faster
/// than cubes of 4 on an H200 (1 040 against 1 006 tok/s, medians of 2 and 6 runs), cubes of
/// 16 warps 3% slower. With 16-column tiles that projection has 560 tiles of 8 warps, one per
/// cube.
pub(crate) const MIN_CUBE_WARPS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct MmaPlan {
    /// Rows of x (at most 16: two MMAs of 8 x rows).
    m: u32,
    /// Warps per tile of 16 output columns, over interleaved steps.
    warps: u32,
    /// Tiles per cube.
    tiles: u32,
    /// Steps per pass of a lane (all loaded before the first is used).
    batch: u32,
    /// f16 activations (else bf16).
    f16: bool,
    epilogue: EpilogueBlueprint,
    /// `Some`: x goes through an RMSNorm first (statistics reduced over the cube).
    norm: Option<ReducePlan>,
    /// Staged 16-byte words (8 k each) per x row: the K of one chunk of steps.
    row_words: u32,
    /// Chunks of steps x is staged in, one after the other (1: all of K at once). Where M x K
    /// does not fit [`STAGE_MAX_BYTES`] the cube stages x a chunk of whole passes at a time and
    /// multiplies it before staging the next.
    chunks: u32,
    /// Passes per chunk (with one chunk, all of them).
    chunk_passes: u32,
    /// Load the first pass's weights before `griddepcontrol.wait` (`ops::caps::has_pdl`).
    early_wait: bool,
    /// Cubes walk tile groups `CUBE_POS, CUBE_POS + CUBE_COUNT, ..` (a gated launch whose groups
    /// outnumber the cubes one wave holds, [`resident_cubes`]); each issues the first pass of its
    /// next group's weights as soon as its partial sums are in shared memory, so those loads fly
    /// while it reduces and writes the group before. Only with x staged whole (one chunk), which
    /// the cube then stages once for all its groups. At the 1.5B model's gate-up on an H200
    /// (560 groups on 396 cubes, 164 of them taking two) W4A16 decoded 2.9% faster (1 187.8
    /// against 1 154.8 tok/s in one call); on 264 cubes of two groups each, +0.8% and -0.3% in
    /// two calls (down's cubes found no room beside gate-up's until gate-up ended). Also slower
    /// there: the later groups handed out as tickets to the cubes of the fewest SMs that hold
    /// them (by `%smid`), so that down's cubes start on the others (-4.3%), and four cubes per SM
    /// (-4.5%).
    ///
    /// `Some(n)`: the `n` cubes one SM holds, which the launch's one wave counts on; the
    /// kernel asks the compiler for them (its registers are capped to fit).
    persistent: Option<u32>,
    /// Signal `griddepcontrol.launch_dependents`: with `early_wait`, as soon as the first pass's
    /// weight loads are issued, before the wait (the next kernel launches while this one still
    /// runs and issues its own early weight loads, so each projection of the step overlaps the
    /// one before; measured on an H200 at the 1.5B shape: W4A16 decode +3.5%, from all four
    /// projections together, none alone moved it; the same change cost the bf16 GEMV 5% and the
    /// 8-bit skinny kernel 9%, not analysed); otherwise once the weights are read.
    trigger: bool,
}

impl MmaPlan {
    fn halves(&self) -> usize {
        self.tile_sums().halves as usize
    }

    /// bf16: the weights enter the MMA as `136 + n` (one LOP3 per pair, no subtraction), and
    /// each step's sums lose `136 · Σx` over the step's k, summed per x row when x is staged.
    /// The f32 sums cancel about `136 · Σ|x| / |Σ n x|`, a few bits of f32's 24, far below a
    /// bf16 output's rounding. (f16 pairs are `1032 + n`: 8x more cancellation, so they are
    /// unbiased per pair instead.)
    fn biased(&self) -> bool {
        !self.f16
    }

    /// MMAs per weight fragment: x rows 0..8, and 8..16 above 8 rows.
    fn x_halves(&self) -> usize {
        self.tile_sums().x_halves as usize
    }

    /// How the warps' partial sums are laid out in shared memory.
    fn tile_sums(&self) -> TileSums {
        TileSums::new(self.m, self.warps, self.tiles, self.epilogue.is_gated())
    }
}

/// Registers of an SM and units it holds at most (sm_80 to sm_90).
const SM_REGISTERS: usize = 64 * 1024;
const SM_UNITS: usize = 2048;

/// Cubes of `units` of the gated kernel that one SM is to hold, from the registers a unit may
/// take: 80 up to 8 x rows (CUPTI on an H200: 77 for the plain launch, 95 for the persistent one
/// before its registers were capped to fit three 256-unit cubes), 104 above (twice the
/// accumulators). The persistent launch asks the compiler for this count
/// ([`request_cubes_per_sm`]).
fn resident_cubes(units: usize, m: usize) -> usize {
    let registers = if m > 8 { 104 } else { 80 };
    (SM_REGISTERS / (units * registers))
        .min(SM_UNITS / units)
        .max(1)
}

/// Asks that `n` cubes fit one SM (2 to 6; one always fits): the patched CUDA runtime reads this
/// PTX comment and gives the entry point `__launch_bounds__(units, n)`, so ptxas caps the
/// registers per unit to fit.
#[cube]
fn request_cubes_per_sm(#[comptime] n: u32) {
    if comptime![n == 2] {
        gpu_asm!("// cubellm.min_cubes_per_sm 2");
    } else if comptime![n == 3] {
        gpu_asm!("// cubellm.min_cubes_per_sm 3");
    } else if comptime![n == 4] {
        gpu_asm!("// cubellm.min_cubes_per_sm 4");
    } else if comptime![n == 5] {
        gpu_asm!("// cubellm.min_cubes_per_sm 5");
    } else if comptime![n == 6] {
        gpu_asm!("// cubellm.min_cubes_per_sm 6");
    }
}

/// Whether [`gemv_mma`] takes `x[m, k]` of `dtype` with scale groups of `group` along K: a
/// runtime with the bf16/f16 MMA, `m <= 16`, K a multiple of 32 (16-byte weight loads) and
/// groups of whole steps. Any K: x is staged in chunks of steps where all of it does not fit
/// [`STAGE_MAX_BYTES`].
pub(crate) fn can_run<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    m: usize,
    k: usize,
    group: usize,
) -> bool {
    m <= 16
        && k.is_multiple_of(32)
        && (group == k || group.is_multiple_of(STEP_K))
        && STAGE_MAX_BYTES + RED_MAX_BYTES + 1024
            <= client.properties().hardware.max_shared_memory_size
        && caps::vector_size_for(client, dtype, 8) == 8
        && has_mma16(client, dtype)
}

/// The weight vectors of one pass of a lane: step `s0 + j · warps` of its two rows (`gid` and
/// `gid + 8` of the tile, and the matching up rows when gated), zeros past K or past the matrix,
/// and the two rows' scales of the step's group.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_pass(
    qweight: &[Vector<i32, Const<4>>],
    scales: &[f32],
    wr: &mut Array<Vector<i32, Const<4>>>,
    sr: &mut Array<f32>,
    row: usize,
    n: usize,
    s0: usize,
    steps: usize,
    k_vectors: usize,
    groups: usize,
    steps_per_group: usize,
    up_offset: usize,
    #[comptime] plan: MmaPlan,
) {
    let tig = (UNIT_POS as usize % 32) % 4;
    #[unroll]
    for j in 0..comptime![plan.batch as usize] {
        let s = s0 + j * comptime![plan.warps as usize];
        let v = s * 4 + tig;
        let g = select(s < steps, s / steps_per_group, 0);
        #[unroll]
        for half in 0..comptime![plan.halves()] {
            #[unroll]
            for r in 0..2usize {
                // Rows past N read row 0's scale (their outputs are never written).
                let nr = row + 8 * r;
                let src = select(nr < n, nr, 0) + half * up_offset;
                let mut wv = Vector::<i32, Const<4>>::new(0i32);
                if nr < n && s < steps && v < k_vectors {
                    wv = qweight[src * k_vectors + v];
                }
                let i = (j * comptime![plan.halves()] + half) * 2 + r;
                wr[i] = wv;
                sr[i] = scales[src * groups + g];
            }
        }
    }
}

/// Cube: `tiles` tiles of 16 output columns, `warps` warps each (over interleaved steps). Unit
/// (warp, lane = 4 gid + tig): loads weight rows `gid` and `gid + 8` of its tile and x row `gid`
/// (above 8 rows also `gid + 8`) from the staged copy, and accumulates the outputs of those two
/// weight rows for x rows `2 tig` and `2 tig + 1` (above 8 rows also `+ 8`).
#[cube(launch_unchecked)]
// A comptime condition stays apart from the runtime one it guards (`collapsible_if`).
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn w4a16_mma_kernel<F: Float, NX: Size>(
    x: &[Vector<F, NX>],
    qweight: &[Vector<i32, Const<4>>],
    scales: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    norm_w: &[Vector<F, NX>],
    n: usize,
    k: usize,
    tile_groups: usize,
    steps: usize,
    groups: usize,
    steps_per_group: usize,
    up_offset: usize,
    inv_k: f32,
    eps: f32,
    #[comptime] plan: MmaPlan,
    #[define(F)] _dtype: ElemType,
) {
    let m_rows = comptime![plan.m as usize];
    let warps = comptime![plan.warps as usize];
    let halves = comptime![plan.halves()];
    let x_halves = comptime![plan.x_halves()];
    let batch = comptime![plan.batch as usize];
    let f16 = comptime![plan.f16];
    let row_words = comptime![plan.row_words as usize];
    let tid = UNIT_POS as usize;
    let warp = (tid / 32) % warps;
    let tile = tid / (32 * warps);
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    if comptime![plan.persistent.is_some()] {
        request_cubes_per_sm(comptime![plan.persistent.unwrap()]);
    }
    let k_vectors = k / 32;
    // The tile group this cube multiplies: its position, then (persistent) every cube count on.
    let mut group = CUBE_POS;
    let mut row = (group * comptime![plan.tiles as usize] + tile) * TILE_N + gid;

    let mut wr =
        Array::<Vector<i32, Const<4>>>::new(comptime![2 * plan.batch as usize * plan.halves()]);
    let mut sr = Array::<f32>::new(comptime![2 * plan.batch as usize * plan.halves()]);
    load_pass(
        qweight,
        scales,
        &mut wr,
        &mut sr,
        row,
        n,
        warp,
        steps,
        k_vectors,
        groups,
        steps_per_group,
        up_offset,
        plan,
    );
    if comptime![plan.early_wait] {
        if comptime![plan.trigger] {
            gpu_asm!("griddepcontrol.launch_dependents;");
        }
        // Only weights and scales were read so far (never written by any kernel): qweight,
        // scales, bias and norm_w are the parameters read before the wait (`ops::pdl`).
        gpu_asm!("// cubellm.early_params 1 2 3 6");
        gpu_asm!("griddepcontrol.wait;");
    }

    // x staged as packed pairs in the MMA's k order: word `i` of a row (k = 8i..) holds (x0, x4),
    // (x1, x5), (x2, x6), (x3, x7); zeros past K. The input norm, in bf16: the staged values are
    // `x · g`, and the row's `rsqrt(mean(x²) + eps)`, a scalar, multiplies the sums at the end
    // (`norm(x) · W = rsqrt(..) · ((x · g) · W)`), so x is read once and its squares are summed
    // in the same pass. In f16, whose range `x · g` of an unnormalised row may exceed, the row
    // is normalised first (a reduction over the cube before the staging).
    let streamed = comptime![plan.norm.is_some() && !plan.f16];
    let mut inv_rms = Array::<f32>::new(m_rows);
    if comptime![plan.norm.is_some() && plan.f16] {
        inv_rms = row_inv_rms::<F, NX>(x, k / 8, inv_k, eps, m_rows, comptime![plan.norm.unwrap()]);
    }
    let mut xs =
        Shared::<[Vector<u32, Const<4>>]>::new_slice(comptime![(plan.m * plan.row_words) as usize]);
    let x_words = k / 8;
    let mut squares = Array::<f32>::new(m_rows);
    // With biased weights: Σx over each step's 128 k of each staged row (16 words, 16 lanes of a
    // warp in the same pass: the loop runs alike on every lane for the shuffles).
    let steps_staged = comptime![plan.row_words as usize / 16];
    let mut xsum = Shared::<[f32]>::new_slice(comptime![if plan.biased() {
        plan.m as usize * plan.row_words as usize / 16
    } else {
        1
    }]);
    #[unroll]
    for r in 0..m_rows {
        squares[r] = 0f32;
    }
    // acc[4 (half · x_halves + xh) + e]: weight row gid + 8 (e / 2), x row 8 xh + 2 tig + e % 2.
    let mut acc = Array::<f32>::new(comptime![4 * plan.halves() * plan.x_halves()]);
    let chunks = comptime![plan.chunks as usize];
    let per_pass = warps * batch;
    let passes = steps.div_ceil(per_pass);
    let chunk_passes = comptime![plan.chunk_passes as usize];
    let sums = comptime![plan.tile_sums()];
    let mut red = Shared::<[f32]>::new_slice(comptime![sums.shared_len()]);
    let mut stage_x = true;
    while group < tile_groups {
        #[unroll]
        for i in 0..comptime![4 * plan.halves() * plan.x_halves()] {
            acc[i] = 0f32;
        }
        for chunk in 0..chunks {
            let first_word = chunk * row_words;
            if chunk > 0 {
                // Every warp is done with the chunk before.
                sync_cube();
            }
            // A persistent cube's later groups read the x staged for its first.
            if stage_x {
                #[unroll]
                for r in 0..m_rows {
                    for base in range_stepped(0, row_words, CUBE_DIM as usize) {
                        let wi = base + tid;
                        let gw = first_word + wi;
                        let mut packed = Vector::<u32, Const<4>>::new(0u32);
                        if gw < x_words && wi < row_words {
                            let xv = x[r * x_words + gw];
                            let mut xf = Vector::<f32, NX>::cast_from(xv);
                            if comptime![streamed] {
                                squares[r] += sum_squares(xv);
                                xf *= Vector::<f32, NX>::cast_from(norm_w[gw]);
                            } else if comptime![plan.norm.is_some()] {
                                xf = Vector::<f32, NX>::cast_from(scale_by_weight(
                                    xv, norm_w[gw], inv_rms[r],
                                ));
                            }
                            #[unroll]
                            for p in 0..4usize {
                                packed.insert(p, pack_pair(xf.extract(p), xf.extract(p + 4), f16));
                            }
                        }
                        if wi < row_words {
                            xs[r * row_words + wi] = packed;
                        }
                        if comptime![plan.biased()] {
                            // The staged (rounded) values: a bf16 is the high half of its f32.
                            let mut sum = 0f32;
                            #[unroll]
                            for p in 0..4usize {
                                let pair = packed.extract(p);
                                sum += f32::reinterpret(pair << 16u32)
                                    + f32::reinterpret(pair & 0xFFFF_0000u32);
                            }
                            sum += plane_shuffle_xor(sum, 1u32);
                            sum += plane_shuffle_xor(sum, 2u32);
                            sum += plane_shuffle_xor(sum, 4u32);
                            sum += plane_shuffle_xor(sum, 8u32);
                            if wi < row_words && (wi & 15) == 0 {
                                xsum[r * steps_staged + wi / 16] = sum;
                            }
                        }
                    }
                }
                // In one chunk, the cube-wide sums' barrier also publishes the staged x;
                // otherwise a plain one, and the sums follow the last chunk.
                if comptime![streamed && plan.chunks == 1] {
                    #[unroll]
                    for r in 0..m_rows {
                        inv_rms[r] =
                            cube_inv_rms(squares[r], inv_k, eps, comptime![plan.norm.unwrap()]);
                    }
                } else {
                    sync_cube();
                }
            }
            // The MMA's B column gid is x row gid (rows past M read x row 0: their outputs are never
            // written); above 8 rows a second MMA takes x rows 8..16.
            let lo_base = select(gid < m_rows, gid, 0) * row_words;
            let hi_base = select(gid + 8 < m_rows, gid + 8, 0) * row_words;
            let chunk_steps = chunk_passes * per_pass;
            for p in chunk * chunk_passes..min(passes, (chunk + 1) * chunk_passes) {
                if p > 0 {
                    load_pass(
                        qweight,
                        scales,
                        &mut wr,
                        &mut sr,
                        row,
                        n,
                        p * per_pass + warp,
                        steps,
                        k_vectors,
                        groups,
                        steps_per_group,
                        up_offset,
                        plan,
                    );
                }
                #[unroll]
                for j in 0..batch {
                    let s = p * per_pass + j * warps + warp;
                    if s < steps {
                        // Two MMA chains per (half, x half), one per nibble pair index h, summed at the
                        // end of the step: two independent chains of four instead of one of eight.
                        let mut d = Array::<Vector<f32, Const<4>>>::new(comptime![
                            2 * plan.halves() * plan.x_halves()
                        ]);
                        #[unroll]
                        for i in 0..comptime![2 * plan.halves() * plan.x_halves()] {
                            d[i] = Vector::<f32, Const<4>>::new(0f32);
                        }
                        #[unroll]
                        for w in 0..4usize {
                            let xw = (s - chunk * chunk_steps) * 16 + tig * 4 + w;
                            // B per x half: x rows 0..8, above 8 rows also 8..16.
                            let mut xv =
                                Array::<Vector<u32, Const<4>>>::new(comptime![plan.x_halves()]);
                            xv[0] = xs[lo_base + xw];
                            if comptime![plan.x_halves() == 2] {
                                xv[1] = xs[hi_base + xw];
                            }
                            #[unroll]
                            for half in 0..halves {
                                let i = (j * halves + half) * 2;
                                let lo = wr[i].extract(w);
                                let hi = wr[i + 1].extract(w);
                                #[unroll]
                                for h in 0..2u32 {
                                    let hh = comptime![h as usize];
                                    // A fragment: row gid's pairs in a0 and a2, row gid + 8's in a1 and
                                    // a3; nibble pair 2h is MMA k (2 tig, 2 tig + 1), pair 2h + 1 is
                                    // (2 tig + 8, 2 tig + 9), and x's staged pairs 2h and 2h + 1 are
                                    // the same k in B.
                                    let mut a = Vector::<u32, Const<4>>::new(0u32);
                                    a.insert(0usize, nibble_pair(lo, comptime![2 * h], f16, true));
                                    a.insert(1usize, nibble_pair(hi, comptime![2 * h], f16, true));
                                    a.insert(
                                        2usize,
                                        nibble_pair(lo, comptime![2 * h + 1], f16, true),
                                    );
                                    a.insert(
                                        3usize,
                                        nibble_pair(hi, comptime![2 * h + 1], f16, true),
                                    );
                                    #[unroll]
                                    for xh in 0..x_halves {
                                        let di = (half * x_halves + xh) * 2 + hh;
                                        d[di] = mma_m16n8k16(
                                            a.extract(0usize),
                                            a.extract(1usize),
                                            a.extract(2usize),
                                            a.extract(3usize),
                                            xv[xh].extract(2 * hh),
                                            xv[xh].extract(2 * hh + 1),
                                            d[di],
                                            f16,
                                        );
                                    }
                                }
                            }
                        }
                        // With biased weights, 136 · Σx of the step for this lane's x rows.
                        let mut offset = Array::<f32>::new(comptime![2 * plan.x_halves()]);
                        #[unroll]
                        for o in 0..comptime![2 * plan.x_halves()] {
                            offset[o] = 0f32;
                            if comptime![plan.biased()] {
                                let xr = 8 * (o / 2) + 2 * tig + o % 2;
                                let xr = select(xr < m_rows, xr, 0);
                                offset[o] =
                                    136f32 * xsum[xr * steps_staged + s - chunk * chunk_steps];
                            }
                        }
                        #[unroll]
                        for half in 0..halves {
                            #[unroll]
                            for xh in 0..x_halves {
                                let c = (half * x_halves + xh) * 2;
                                let d0 = d[c];
                                let d1 = d[c + 1];
                                #[unroll]
                                for e in 0..4usize {
                                    acc[2 * c + e] += (d0.extract(e) + d1.extract(e)
                                        - offset[2 * xh + e % 2])
                                        * sr[(j * halves + half) * 2 + e / 2];
                                }
                            }
                        }
                    }
                }
            }
        }
        if comptime![streamed && plan.chunks > 1] {
            #[unroll]
            for r in 0..m_rows {
                inv_rms[r] = cube_inv_rms(squares[r], inv_k, eps, comptime![plan.norm.unwrap()]);
            }
        }
        if comptime![plan.trigger && !plan.early_wait] {
            gpu_asm!("griddepcontrol.launch_dependents;");
        }

        // The tile's warps summed in warp order.
        stash_tile_sums(&mut red, &acc, tile, warp, sums);
        // The next group's first pass, into the registers the MMAs and the partial sums are done
        // with: it loads while this group is reduced and written.
        let next = group + CUBE_COUNT;
        if comptime![plan.persistent.is_some()] {
            if next < tile_groups {
                row = (next * comptime![plan.tiles as usize] + tile) * TILE_N + gid;
                load_pass(
                    qweight,
                    scales,
                    &mut wr,
                    &mut sr,
                    row,
                    n,
                    warp,
                    steps,
                    k_vectors,
                    groups,
                    steps_per_group,
                    up_offset,
                    plan,
                );
            }
        }
        sync_cube();
        write_tile_sums::<F>(
            &red,
            out,
            bias,
            residual,
            &inv_rms,
            scales,
            group,
            n,
            up_offset,
            sums,
            streamed,
            false,
            plan.epilogue,
        );
        if comptime![plan.persistent.is_some()] {
            // Every unit is done reading this group's partial sums before the next group's land.
            sync_cube();
        }
        stage_x = false;
        group = next;
    }
}

/// The kernel's plan for `[m, k, n]` (f16 activations, else bf16) on `device`, the cube
/// reduction `reduce` gives for that many units; with the units per cube, the cube count and the
/// tile groups.
fn launch_plan(
    [m, k, n]: [usize; 3],
    f16: bool,
    epilogue: EpilogueBlueprint,
    norm: bool,
    device: SmDevice,
    reduce: impl FnOnce(u32) -> ReducePlan,
) -> (MmaPlan, u32, u32, usize) {
    let steps = k.div_ceil(STEP_K);
    let tiles = n.div_ceil(TILE_N);
    let sms = device.sms;
    let shape = LaunchShape::new(m, steps, tiles, sms, epilogue.is_gated());
    let units = (32 * shape.warps * shape.per_cube) as u32;
    // Gated tile groups past one wave: cubes for one wave, each walking several groups. (The
    // int4 LM head, 9 496 tiles in groups of 8, decoded slower that way: W4A16 with it 1 177.3
    // tok/s against 1 186.3 without it on an H200, where it had been 7.8% faster.)
    let tile_groups = tiles.div_ceil(shape.per_cube);
    let resident = resident_cubes(units as usize, m);
    let wave = sms * resident;
    // `request_cubes_per_sm` names up to 6 cubes (one cube always fits its launch bounds).
    let persistent =
        epilogue.is_gated() && shape.chunks == 1 && tile_groups > wave && resident <= 6;
    let plan = MmaPlan {
        m: m as u32,
        warps: shape.warps as u32,
        tiles: shape.per_cube as u32,
        batch: shape.batch as u32,
        f16,
        epilogue,
        norm: norm.then(|| reduce(units)),
        row_words: (shape.chunk_steps * STEP_K / 8) as u32,
        chunks: shape.chunks as u32,
        chunk_passes: shape.chunk_passes as u32,
        persistent: persistent.then_some(resident as u32),
        early_wait: device.pdl,
        trigger: device.trigger,
    };
    let cubes = if persistent { wave } else { tile_groups } as u32;
    (plan, units, cubes, tile_groups)
}

/// The tensor-core GEMV on validated operands where [`can_run`] holds: `x[M, K]` contiguous
/// bf16/f16, `qweight_nk[N, K/8]` (`[2N, K/8]` when gated), `scales_nk[.., K/group]` f32,
/// `out[M, N]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_mma<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight_nk: &DeviceTensor<R>,
    scales_nk: &DeviceTensor<R>,
    group: usize,
    epilogue: NkEpilogue<'_, R>,
    out: &DeviceTensor<R>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    debug_assert!(can_run(client, x.dtype(), m, k, group));
    let steps = k.div_ceil(STEP_K);
    let (plan, units, cubes, tile_groups) = launch_plan(
        [m, k, n],
        x.dtype() == DType::F16,
        epilogue.blueprint(),
        epilogue.norm.is_some(),
        SmDevice::of(client),
        |units| ReducePlan::new(client, units),
    );
    let (bias, residual, norm_w, eps) = epilogue.operands(x);
    let up_offset = if epilogue.gate.is_some() { n } else { 0 };
    let groups = k / group;
    unsafe {
        w4a16_mma_kernel::launch_unchecked::<R>(
            client,
            ops::launch::cube_count_1d(client, cubes),
            CubeDim::new_1d(units),
            8usize,
            x.as_buffer_arg(),
            qweight_nk.as_buffer_arg(),
            scales_nk.as_buffer_arg(),
            bias.as_buffer_arg(),
            residual.as_buffer_arg(),
            out.as_buffer_arg(),
            norm_w.as_buffer_arg(),
            n,
            k,
            tile_groups,
            steps,
            groups,
            // One group per output channel: every step in group 0.
            if group == k { steps } else { group / STEP_K },
            up_offset,
            1.0 / k as f32,
            eps,
            plan,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}
