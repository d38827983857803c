//! The skinny tensor-core kernel for M <= 16 (CUDA, decode): m16n8 output tiles, K split over up
//! to 16 warps per tile where the tiles are few, the K slices summed at the end. Weights go
//! straight from global memory into fragments, a batch of up to 12 chunks per warp in flight (8
//! in a gated launch), the first batch loaded before `griddepcontrol.wait` under programmatic
//! dependent launch (weights are never written by a kernel). The activation codes are quantized
//! by the kernel itself where the row is short and the cubes few (the 1.5B model's qkv and o at
//! one row); otherwise a one-cube-per-row pre-pass quantizes them (and applies the input norm),
//! signalling this kernel to launch as it starts so that the weights stream while it runs, and
//! the kernel copies the codes into shared memory once per cube.
//!
//! On an H100 at the 1.5B shape and one row this took gate-up from 15.6 to about 10 µs and down
//! from 12.3 to about 4.5 µs per layer (the pre-pass adds 5-6 µs before each); each cube
//! quantizing all of down's 8960 activations itself had made its prologue most of its
//! instructions.

use cubecl::prelude::*;
use ops::{caps, DeviceTensor};

use super::epilogue::{write_gated, write_output, write_scaled, EpiloguePlan, Gemm8Out};
use super::mma::mma_m16n8k32;
use super::words::load_vec;
use super::{has_mma8, Gemm8};
use crate::format::QuantFormat;
use crate::rowquant::{quantize_row_held, RowQuantPlan};

/// Rows of A the skinny kernel takes: one m16 MMA tile.
pub(crate) const SKINNY_MAX_M: usize = 16;
/// Most 64-byte K chunks a warp of a gated launch loads before it uses the first (4 vector
/// registers each): gate-up's registers already bound how many of its cubes an SM holds.
const MAX_GATED_BATCH: usize = 8;
/// The same for FP8, whose e4m3 MMA ptxas emulates on sm_90 (12 `F2FP` conversions and two f16
/// MMAs each), which takes registers: with 8 chunks the gated cube of 128 units needs 62 (64
/// allocated), an SM holds 8 and the 1.5B model's 1 120 gate-up cubes overflow one wave of 132
/// SMs; with 6 it needs 54 and 9 fit, as int8's 56 at 8. Measured on an H200 (same binary, the
/// batch chosen by a switch): gate-up 18.6 → 15.9 µs under ncu, FP8 decode 732.5 → 776.3 tok/s.
const MAX_GATED_BATCH_FP8: usize = 6;
/// The same for the other launches, where registers are not the limit: up to 12 chunks, so that
/// the 1.5B model's down projection (140 chunks over 16 warps per tile, 9 each) loads its whole K
/// slice in one batch before `griddepcontrol.wait`, where 8 left a second round of loads, and
/// their latency, after the wait.
const MAX_BATCH: usize = 12;
/// Bytes of activation codes the skinny kernel stages in shared memory (rows x padded K).
pub(crate) const STAGE_MAX_BYTES: usize = 16 * 1024;

/// Where the skinny kernel's A operand (the activation codes) comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum XSource {
    /// Read from the codes in global memory at every chunk (any K).
    Global,
    /// Copied once per cube from the codes in global memory into shared memory.
    Staged,
    /// Quantized from the float activation by every cube (the row scales computed, the codes
    /// staged in shared memory with the pre-pass's own functions, so the same bytes): no
    /// pre-pass launch, for `N / 8` redundant passes over x.
    Quantize,
}

impl XSource {
    /// Where codes of `rows` rows of `pitch` bytes come from: staged where they fit in shared
    /// memory, else global memory.
    fn for_codes(rows: usize, pitch: usize) -> Self {
        if rows * pitch <= STAGE_MAX_BYTES {
            XSource::Staged
        } else {
            XSource::Global
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SkinnyPlan {
    pub epi: EpiloguePlan,
    /// Warps per output tile; they split K.
    pub warps: u32,
    /// Output tiles (of 8 columns) per cube.
    pub tiles: u32,
    /// Chunks per warp whose weight loads are issued before the first is multiplied.
    pub batch: u32,
    /// At most 8 rows: the MMA's rows `gid + 8` are free and take the second half of row
    /// `gid`'s products (see [`gemm8_skinny_kernel`]).
    pub paired: bool,
    pub x: XSource,
    /// [`XSource::Quantize`]: code words (four codes) each unit quantizes per row.
    pub held: u32,
    /// Load the first batch of weights before `griddepcontrol.wait` (programmatic dependent
    /// launch: nothing before the wait reads what a kernel writes) and signal
    /// `griddepcontrol.launch_dependents` once the weights are read.
    pub early: bool,
    /// How [`XSource::Quantize`] reads and encodes x.
    pub rows: RowQuantPlan,
}

/// The weight vectors of one batch of a lane: chunk `c0 + j · warps` of row `col` (zeros past K
/// and past the matrix).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_weights(
    b: &[Vector<i32, Const<4>>],
    wv: &mut Array<Vector<i32, Const<4>>>,
    col: usize,
    col_ok: bool,
    c0: usize,
    chunks: usize,
    k: usize,
    b_pv: usize,
    #[comptime] plan: SkinnyPlan,
) {
    let tig = (UNIT_POS as usize % 32) % 4;
    #[unroll]
    for j in 0..comptime![plan.batch as usize] {
        let c = c0 + j * comptime![plan.warps as usize];
        wv[j] = load_vec(b, col, col_ok && c < chunks, c * 64 + tig * 16, k, b_pv);
    }
}

/// 16 bytes of x row `row` at byte `byte`: from the staged codes (zeros past K, the index kept
/// within the row) or from global memory.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_x(
    a: &[Vector<i32, Const<4>>],
    staged: &[Vector<i32, Const<4>>],
    row: usize,
    byte: usize,
    k: usize,
    a_pv: usize,
    #[comptime] x: XSource,
) -> Vector<i32, Const<4>> {
    if comptime![x == XSource::Global] {
        load_vec(a, row, true, byte, k, a_pv)
    } else {
        staged[row * a_pv + min(byte / 16, a_pv - 1)]
    }
}

/// `out[m, n0..n0 + 8]` for all `m < M <= 16`: one m16n8 output tile per cube, its K split over
/// the cube's warps and summed through shared memory. Each thread loads 16 contiguous bytes of
/// one weight row per 64-byte K chunk (a warp reads 8 rows x 64 bytes: whole sectors), a batch
/// of chunks before it multiplies the first, and the same bytes of activation rows `gid` and
/// `gid + 8`. The MMA's k order is a permutation of the physical bytes, the same for A and B, so
/// the dot products are unchanged: above 8 rows words 0/1 of a thread's vector feed the first
/// MMA and 2/3 the second. Up to 8 rows the MMA's second row half is free: the four words of
/// x row `gid` are the A registers as loaded, one MMA takes weight words 0 and 2 (its rows `gid`
/// hold that half of the products), a second words 1 and 3 (its rows `gid + 8` hold the other
/// half), each into its own accumulator; rows past M read row 0 and are never written.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn gemm8_skinny_kernel<F: Float, Acc: Numeric, NX: Size>(
    a: &[Vector<i32, Const<4>>],
    x: &[Vector<F, NX>],
    b: &[Vector<i32, Const<4>>],
    mut io: Gemm8Out<F>,
    norm_w: &[Vector<F, NX>],
    norm_eps: f32,
    a_pv: usize,
    b_pv: usize,
    #[comptime] plan: SkinnyPlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let m = io.m;
    let n = io.n;
    let k = io.k;
    let warps = comptime![plan.warps as usize];
    let batch = comptime![plan.batch as usize];
    let tid = UNIT_POS as usize;
    let warp = (tid / 32) % warps;
    let tile = tid / (32 * warps);
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    let gated = comptime![plan.epi.gate.is_some()];
    let own_scales = comptime![plan.x != XSource::Global];
    // The weight row this lane's quad reads: plain, tile `t` of the cube covers rows
    // `8 t ..`; gated, tiles pair up (gate rows `8 p ..`, then the matching up rows `N/2` below).
    let mut n0 = (CUBE_POS * comptime![plan.tiles as usize] + tile) * 8;
    let mut limit = n;
    let mut row_base = 0usize;
    if gated {
        let pairs = comptime![plan.tiles as usize / 2];
        limit = n / 2;
        n0 = (CUBE_POS * pairs + tile / 2) * 8;
        row_base = (tile % 2) * limit;
    }
    let col_ok = n0 + gid < limit;
    let col = select(col_ok, row_base + n0 + gid, 0);
    let chunks = k.div_ceil(64);

    let mut wv = Array::<Vector<i32, Const<4>>>::new(comptime![plan.batch as usize]);
    if comptime![plan.early] {
        load_weights(b, &mut wv, col, col_ok, warp, chunks, k, b_pv, plan);
        // Only weights were read so far (never written by any kernel): b and sb, with the bias
        // and norm_w, are the parameters read before the wait (`ops::pdl`).
        gpu_asm!("// cubellm.early_params 2 4 5 8");
        gpu_asm!("griddepcontrol.wait;");
    }

    let mut staged =
        Shared::<[Vector<i32, Const<4>>]>::new_slice(comptime![if plan.x == XSource::Global {
            1
        } else {
            STAGE_MAX_BYTES / 16
        }]);
    let mut scales = Shared::<[f32]>::new_slice(SKINNY_MAX_M);
    if comptime![plan.x == XSource::Quantize] {
        let mut words = Array::<u32>::new(comptime![plan.held as usize]);
        for r in 0..m {
            let s = quantize_row_held::<F, NX>(
                x,
                norm_w,
                r,
                k,
                norm_eps,
                &mut words,
                comptime![plan.held as usize],
                plan.rows,
            );
            if tid == 0 {
                scales[r] = s;
            }
            // Lanes 4q .. 4q + 3 hold the four words of one 16-byte vector of codes.
            let lane32 = lane as u32;
            #[unroll]
            for j in 0..comptime![plan.held as usize] {
                let word = i32::reinterpret(words[j]);
                let w1 = plane_shuffle(word, lane32 | 1);
                let w2 = plane_shuffle(word, lane32 | 2);
                let w3 = plane_shuffle(word, lane32 | 3);
                let v = (tid + j * CUBE_DIM as usize) / 4;
                if (lane & 3) == 0 && v < a_pv {
                    let mut codes = Vector::<i32, Const<4>>::new(word);
                    codes.insert(1usize, w1);
                    codes.insert(2usize, w2);
                    codes.insert(3usize, w3);
                    staged[r * a_pv + v] = codes;
                }
            }
        }
        sync_cube();
    }
    if comptime![plan.x == XSource::Staged] {
        for v in range_stepped(tid, m * a_pv, CUBE_DIM as usize) {
            staged[v] = a[v];
        }
        if tid < m {
            scales[tid] = if comptime![plan.epi.sa_scalar] {
                io.sa[0]
            } else {
                io.sa[tid]
            };
        }
        sync_cube();
    }

    // acc[0] holds C[gid][2 tig + e] (e = 0, 1) and C[gid + 8][2 tig + e] (e = 2, 3); paired,
    // row gid's sums are acc[0]'s rows gid plus acc[1]'s rows gid + 8.
    let mut acc = Array::<Vector<Acc, Const<4>>>::new(2usize);
    acc[0] = Vector::<Acc, Const<4>>::new(Acc::from_int(0));
    acc[1] = Vector::<Acc, Const<4>>::new(Acc::from_int(0));
    let lo_row = select(gid < m, gid, 0);
    let hi_row = select(gid + 8 < m, gid + 8, 0);
    let per_pass = warps * batch;
    let passes = chunks.div_ceil(per_pass);
    for p in 0..passes {
        if p > 0 || !comptime![plan.early] {
            load_weights(
                b,
                &mut wv,
                col,
                col_ok,
                p * per_pass + warp,
                chunks,
                k,
                b_pv,
                plan,
            );
        }
        #[unroll]
        for j in 0..batch {
            let c = p * per_pass + j * warps + warp;
            if c < chunks {
                let byte = c * 64 + tig * 16;
                let bw = wv[j];
                let lo = load_x(a, &staged, lo_row, byte, k, a_pv, plan.x);
                if comptime![plan.paired] {
                    // MMA h: weight words h and h + 2, into accumulator h.
                    #[unroll]
                    for h in 0..2usize {
                        acc[h] = mma_m16n8k32::<Acc>(
                            lo.extract(0usize),
                            lo.extract(1usize),
                            lo.extract(2usize),
                            lo.extract(3usize),
                            bw.extract(h),
                            bw.extract(h + 2),
                            acc[h],
                            plan.epi.fp8,
                        );
                    }
                } else {
                    let hi = load_x(a, &staged, hi_row, byte, k, a_pv, plan.x);
                    #[unroll]
                    for half in 0..2usize {
                        acc[0] = mma_m16n8k32::<Acc>(
                            lo.extract(2 * half),
                            hi.extract(2 * half),
                            lo.extract(2 * half + 1),
                            hi.extract(2 * half + 1),
                            bw.extract(2 * half),
                            bw.extract(2 * half + 1),
                            acc[0],
                            plan.epi.fp8,
                        );
                    }
                }
            }
        }
    }
    if comptime![plan.early] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }

    let mut red = Shared::<[Acc]>::new_slice(comptime![(plan.warps * plan.tiles) as usize * 128]);
    let mut cv = acc[0];
    if comptime![plan.paired] {
        let second = acc[1];
        #[unroll]
        for e in 0..2usize {
            cv.insert(e, cv.extract(e) + second.extract(e + 2));
        }
    }
    #[unroll]
    for e in 0..4usize {
        let r = gid + 8 * (e / 2);
        red[(tid / 32) * 128 + r * 8 + 2 * tig + e % 2] = cv.extract(e);
    }
    sync_cube();
    if gated {
        // Pairs x 128 outputs: tile 2p holds the gate sums, 2p + 1 the up sums.
        let pairs = comptime![plan.tiles as usize / 2];
        for idx in range_stepped(
            tid,
            comptime![plan.tiles as usize / 2 * 128],
            CUBE_DIM as usize,
        ) {
            let p = idx / 128;
            let o = idx % 128;
            let r = o / 8;
            let cl = (CUBE_POS * pairs + p) * 8 + o % 8;
            let mut tg = Acc::from_int(0);
            let mut tu = Acc::from_int(0);
            #[unroll]
            for w in 0..warps {
                tg += red[(2 * p * warps + w) * 128 + o];
                tu += red[((2 * p + 1) * warps + w) * 128 + o];
            }
            if r < m && cl < n / 2 {
                // The row's activation scale: staged by the kernel, else given.
                let mut sr = scales[r];
                if !own_scales {
                    if comptime![plan.epi.sa_scalar] {
                        sr = io.sa[0];
                    } else {
                        sr = io.sa[r];
                    }
                }
                let g = f32::cast_from(tg) * sr;
                let u = f32::cast_from(tu) * sr;
                write_gated::<F>(&mut io, g, u, r, cl, plan.epi);
            }
        }
    } else {
        // Tiles x 128 outputs, more than the cube's units when warps < 4.
        for idx in range_stepped(tid, comptime![plan.tiles as usize * 128], CUBE_DIM as usize) {
            let t = idx / 128;
            let o = idx % 128;
            let r = o / 8;
            let cl = (CUBE_POS * comptime![plan.tiles as usize] + t) * 8 + o % 8;
            let mut total = Acc::from_int(0);
            #[unroll]
            for w in 0..warps {
                total += red[(t * warps + w) * 128 + o];
            }
            if r < m && cl < n {
                let t = f32::cast_from(total);
                if own_scales {
                    write_scaled::<F>(&mut io, t * scales[r], r, cl, plan.epi);
                } else {
                    write_output::<F>(&mut io, t, r, cl, plan.epi);
                }
            }
        }
    }
}

/// How the skinny kernel splits the work: `warps` per 8-column tile (splitting K) and `tiles`
/// per cube (8 warps, or the 16 of one tile; gated, one gate/up pair). Enough warps overall to
/// cover the memory latency (about 32 per SM), and no K split where the tiles alone provide them
/// (the 1.5B model's lm_head has 18992).
#[derive(Clone, Copy, Debug)]
struct SkinnyShape {
    warps: u32,
    tiles: u32,
}

impl SkinnyShape {
    /// For `n` weight rows; gated, one (gate, up) pair of tiles per cube.
    ///
    /// Gated cubes hold one pair whatever the warps per tile: a cube's warps meet at its barriers
    /// (staging x, summing the K slices), so the fewer tiles a cube holds the sooner each pair
    /// goes from its loads to its output, and the sooner an SM takes the next cube of a grid
    /// larger than one wave (the 1.5B model's gate-up: 1 120 cubes of 4 warps where 560 of 8 did
    /// not fit the SMs' registers at once either). Measured on an H200 at one row, the 1.5B
    /// model's W8A8 decode went from 797.8 to 858.2 tok/s with one pair instead of two per cube
    /// (medians of two runs of one binary, the shape chosen by a switch).
    ///
    /// Ungated, a warp takes at least [`MIN_WARP_CHUNKS`] of the `k`'s 64-byte chunks where K is
    /// short: the 1.5B model's qkv and o (24 chunks) on 4 warps of 6 chunks, two tiles to a cube,
    /// instead of 16 warps of 1-2 chunks and one tile. Measured on an H200 at one row (same
    /// binary, the cap set by a switch): W8A8 decode 880.9 tok/s with 16 warps, 896.6 with 8,
    /// 902.1 with 4; in the next call, old rule against this one: W8A8 879.9 → 900.9, FP8
    /// 807.7 → 831.1. Fewer warps meet at each cube's barriers, and with two tiles a cube the
    /// cubes that quantize x themselves are half as many.
    fn new<R: Runtime>(client: &ComputeClient<R>, n: usize, k: usize, gated: bool) -> Self {
        Self::for_sms(caps::num_sms(client) as usize, n, k, gated)
    }

    fn for_sms(sms: usize, n: usize, k: usize, gated: bool) -> Self {
        let tiles = n.div_ceil(8).max(1);
        let want = 32 * sms.max(1);
        let warps = want.div_ceil(tiles).next_power_of_two().clamp(1, 16);
        if gated {
            return Self {
                warps: warps.min(8) as u32,
                tiles: 2,
            };
        }
        let chunks = k.div_ceil(64);
        let most = 1 << (chunks / MIN_WARP_CHUNKS).max(1).ilog2();
        let warps = warps.min(most) as u32;
        Self {
            warps,
            tiles: (8 / warps).max(1),
        }
    }

    fn cubes(&self, n: usize, gated: bool) -> usize {
        if gated {
            (n / 2).div_ceil(8).div_ceil(self.tiles as usize / 2)
        } else {
            n.div_ceil(8).div_ceil(self.tiles as usize)
        }
    }
}

/// Fewest 64-byte K chunks per warp of an ungated launch (see [`SkinnyShape::new`]), unless the
/// chunks are fewer than that.
const MIN_WARP_CHUNKS: usize = 6;

/// Longest row (bytes of codes) the kernel quantizes itself: four words per unit of a cube of
/// 256 units, held in registers (a gated cube of fewer units holds more words per unit).
const QUANTIZE_MAX_PITCH: usize = 4 * 4 * 256;
/// Most element encodes (cubes x rows x K) for which every cube quantizing x itself beats a
/// pre-pass launch.
const QUANTIZE_MAX_ENCODES: usize = 512 * 1024;

/// The skinny kernel's plan for `[m, k, n]` (`n` weight rows, gate then up rows when the
/// epilogue is gated) with the activation codes from `source` (rows of `a_pitch` bytes) on
/// `sms` SMs, `early` under programmatic dependent launch, and `rows` the quantization plan for a
/// cube of that many units; with the units per cube and the cube count.
#[allow(clippy::too_many_arguments)]
pub(super) fn skinny_plan(
    [m, k, n]: [usize; 3],
    epi: EpiloguePlan,
    fp8: bool,
    source: XSource,
    a_pitch: usize,
    sms: usize,
    early: bool,
    rows: impl FnOnce(u32) -> RowQuantPlan,
) -> (SkinnyPlan, u32, u32) {
    let gated = epi.gate.is_some();
    let shape = SkinnyShape::for_sms(sms, n, k, gated);
    let (warps, tiles) = (shape.warps, shape.tiles);
    let units = 32 * warps * tiles;
    let chunks = k.div_ceil(64);
    let plan = SkinnyPlan {
        epi,
        warps,
        tiles,
        batch: chunks.div_ceil(warps as usize).clamp(
            1,
            match (gated, fp8) {
                (true, false) => MAX_GATED_BATCH,
                (true, true) => MAX_GATED_BATCH_FP8,
                (false, _) => MAX_BATCH,
            },
        ) as u32,
        paired: m <= 8,
        x: source,
        held: match source {
            XSource::Quantize => (a_pitch / 4).div_ceil(units as usize),
            _ => 0,
        } as u32,
        early,
        rows: rows(units),
    };
    (plan, units, shape.cubes(n, gated) as u32)
}

impl<R: Runtime> Gemm8<'_, R> {
    /// Where the skinny kernel takes the activation codes of `rows` x `k` from for `n` output
    /// columns, or `None` where it does not run (no 8-bit `mma`, more than 16 rows). In the
    /// kernel ([`XSource::Quantize`], no pre-pass launch) while the redundant encodes stay few:
    /// the 1.5B model's qkv and o at M = 1; from a pre-pass otherwise, copied into shared memory
    /// where they fit.
    pub(crate) fn decode_source(
        client: &ComputeClient<R>,
        fp8: bool,
        rows: usize,
        k: usize,
        n: usize,
    ) -> Option<XSource> {
        if !has_mma8(client, fp8) || rows > SKINNY_MAX_M {
            return None;
        }
        let pitch = crate::format::row_pitch(k);
        // The decision is made without the gate: a gated launch has the same cube count.
        let cubes = SkinnyShape::new(client, n, k, false).cubes(n, false);
        Some(match XSource::for_codes(rows, pitch) {
            XSource::Staged
                if pitch <= QUANTIZE_MAX_PITCH && cubes * rows * k <= QUANTIZE_MAX_ENCODES =>
            {
                XSource::Quantize
            }
            codes => codes,
        })
    }

    /// The skinny tensor-core kernel (M <= 16): quantizing the float activation `x` (`[M, K]`,
    /// contiguous) itself when given (`a` and `sa` are then not read), else reading the codes
    /// `a` and scales `sa`.
    pub(crate) fn launch_skinny(&self, client: &ComputeClient<R>, x: Option<&DeviceTensor<R>>) {
        let format = if self.fp8 {
            QuantFormat::Fp8E4M3
        } else {
            QuantFormat::Int8
        };
        let source = match x {
            Some(_) => XSource::Quantize,
            None => XSource::for_codes(self.m, self.a_pitch),
        };
        // Reading codes, `x` is never read: bind the output (CUDA only, where aliasing is
        // allowed).
        let xt = x.unwrap_or(self.out);
        let (plan, units, cubes) = skinny_plan(
            [self.m, self.k, self.n],
            self.epilogue_plan(),
            self.fp8,
            source,
            self.a_pitch,
            caps::num_sms(client) as usize,
            caps::has_pdl(client),
            |units| {
                let mut rows = RowQuantPlan::new(client, xt, format, units);
                rows.norm = self.norm.is_some();
                rows
            },
        );
        debug_assert!(
            !plan.rows.norm || x.is_some(),
            "the input norm needs the quantizing kernel"
        );
        // Without a norm its weight is never read: bind x.
        let (norm_w, norm_eps) = match self.norm {
            Some(n) => (n.weight, n.eps),
            None => (xt, 0.0),
        };
        unsafe {
            gemm8_skinny_kernel::launch_unchecked::<R>(
                client,
                ops::launch::cube_count_1d(client, cubes),
                CubeDim::new_1d(units),
                plan.rows.vector,
                self.vec_arg(self.a),
                xt.as_buffer_arg(),
                self.vec_arg(self.b),
                self.out_arg(),
                norm_w.as_buffer_arg(),
                norm_eps,
                self.a_pitch / 16,
                self.b_pitch / 16,
                plan,
                self.dtypes(),
            );
        }
    }
}

#[cfg(test)]
mod cuda_source;

#[cfg(test)]
mod tests {
    use super::{SkinnyShape, MIN_WARP_CHUNKS};

    /// Ungated launches give every warp at least `MIN_WARP_CHUNKS` chunks (or run one warp per
    /// tile), keep cubes within 16 warps, and leave long K at 16 warps per tile where the tiles
    /// are few (the 1.5B model's down projection); the 1.5B model's qkv and o take 4 warps.
    #[test]
    fn ungated_warps_have_enough_chunks() {
        for n in [8usize, 40, 1536, 2048, 17920, 151936] {
            for k in [64usize, 128, 384, 1000, 1536, 4480, 8960] {
                let s = SkinnyShape::for_sms(132, n, k, false);
                let chunks = k.div_ceil(64);
                let what = format!("n {n} k {k}: {s:?}");
                assert!(s.warps.is_power_of_two() && s.warps <= 16, "{what}");
                assert!(
                    s.warps == 1 || chunks / s.warps as usize >= MIN_WARP_CHUNKS,
                    "{what}"
                );
                assert!(s.warps * s.tiles <= 16, "{what}");
            }
        }
        let down = SkinnyShape::for_sms(132, 1536, 8960, false);
        assert_eq!((down.warps, down.tiles), (16, 1));
        for n in [1536, 2048] {
            let s = SkinnyShape::for_sms(132, n, 1536, false);
            assert_eq!((s.warps, s.tiles), (4, 2), "n {n}");
        }
    }
}
