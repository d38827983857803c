//! The skinny tensor-core kernel for M <= 16 (CUDA, decode): m16n8 output tiles, K cut into
//! slices of up to 8 64-byte chunks, one slice per warp and pass with every weight load of the
//! slice issued before the first `mma` (one memory latency per slice, not one per chunk), the
//! slices summed through shared memory and, where K has more slices than a cube's warps cover,
//! split across cubes and summed by the last to finish ([`ops::gemm::split_k`]); optionally
//! quantizing the activation itself. With programmatic dependent launch the first slice's
//! weights are loaded before `griddepcontrol.wait`, overlapping the end of the kernel before.

use cubecl::prelude::*;
use ops::gemm::{last_to_finish, SplitNeed};
use ops::{caps, DeviceTensor};

use super::epilogue::{write_gated, write_output, write_scaled, EpiloguePlan, Gemm8Out};
use super::mma::mma_m16n8k32;
use super::words::load_vec;
use super::{has_mma8, Gemm8};
use crate::format::QuantFormat;
use crate::rowquant::{encode_word, row_scale, RowQuantPlan};
use ops::norm::sum_squares;
use ops::reduce::cube_sum;

/// Rows of A the skinny kernel takes: one m16 MMA tile.
pub(crate) const SKINNY_MAX_M: usize = 16;
/// 64-byte K chunks of a slice: a lane's 16-byte weight loads in flight per pass.
const MAX_CHUNKS: usize = 8;
/// The most cubes one tile group's K is split over.
const MAX_CUBE_SPLITS: usize = 64;
/// Bytes of activation codes the fused skinny kernel stages in shared memory (rows x padded K):
/// up to this, the linear layers quantize the activation inside the GEMM instead of a pre-pass.
pub(crate) const FUSED_MAX_CODE_BYTES: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SkinnyPlan {
    pub epi: EpiloguePlan,
    /// Warps per output tile, each on its own slice of K.
    pub warps: u32,
    /// Output tiles (of 8 columns) per cube.
    pub tiles: u32,
    /// 64-byte chunks of K per slice.
    pub chunks: u32,
    /// Cubes per tile group, each on its own share of K (above 1: summed through the split
    /// scratch by the last to finish).
    pub cube_splits: u32,
    /// Quantize x in the kernel: every cube computes the row scales and stages the codes in
    /// shared memory (the same functions as the pre-pass, so the same bytes), saving a launch.
    pub fused: bool,
    /// How the fused kernel reads and encodes x.
    pub rows: RowQuantPlan,
    /// Load the first slice's weights before `griddepcontrol.wait` (`ops::caps::has_pdl`).
    pub early_wait: bool,
    /// Signal `griddepcontrol.launch_dependents` once the weights are read.
    pub trigger: bool,
}

impl SkinnyPlan {
    /// Accumulators of one cube's slot in the split scratch: 128 per tile (16 rows x 8 columns).
    fn slot_len(&self) -> usize {
        self.tiles as usize * 128
    }
}

/// The same 16 bytes from the codes the fused kernel staged (already zero past K).
#[cube]
fn load_staged(
    codes: &[i32],
    row: usize,
    valid: bool,
    byte: usize,
    k: usize,
    pitch_words: usize,
) -> Vector<i32, Const<4>> {
    let mut val = Vector::<i32, Const<4>>::new(0i32);
    if valid && byte < k {
        #[unroll]
        for i in 0..4usize {
            val.insert(i, codes[row * pitch_words + byte / 4 + i]);
        }
    }
    val
}

/// The `chunks` 16-byte weight loads of slice `slice` of this lane's row (zeros past K).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_slice(
    bw: &mut Array<Vector<i32, Const<4>>>,
    b: &[Vector<i32, Const<4>>],
    col: usize,
    col_ok: bool,
    slice: usize,
    tig: usize,
    k: usize,
    b_pv: usize,
    #[comptime] chunks: usize,
) {
    #[unroll]
    for h in 0..chunks {
        let byte = (slice * chunks + h) * 64 + tig * 16;
        bw[h] = load_vec(b, col, col_ok, byte, k, b_pv);
    }
}

/// `acc` plus the products of slice `slice`: for each chunk the activation bytes of rows `gid`
/// and `gid + 8` (staged by the fused kernel, or read from `a`) against the loaded weights.
#[cube]
#[allow(clippy::too_many_arguments)]
fn mma_slice<Acc: Numeric>(
    acc: &mut Array<Vector<Acc, Const<4>>>,
    bw: &Array<Vector<i32, Const<4>>>,
    a: &[Vector<i32, Const<4>>],
    codes: &[i32],
    slice: usize,
    gid: usize,
    tig: usize,
    m: usize,
    k: usize,
    a_pv: usize,
    pitch_words: usize,
    #[comptime] plan: SkinnyPlan,
) {
    #[unroll]
    for h in 0..comptime![plan.chunks as usize] {
        let byte = (slice * comptime![plan.chunks as usize] + h) * 64 + tig * 16;
        let lo = if comptime![plan.fused] {
            load_staged(codes, gid, gid < m, byte, k, pitch_words)
        } else {
            load_vec(a, gid, gid < m, byte, k, a_pv)
        };
        let hi = if comptime![plan.fused] {
            load_staged(codes, gid + 8, gid + 8 < m, byte, k, pitch_words)
        } else {
            load_vec(a, gid + 8, gid + 8 < m, byte, k, a_pv)
        };
        let bv = bw[h];
        #[unroll]
        for half in 0..2usize {
            // The accumulator goes in as an array element (a value): a mutable vector variable
            // would reach the inline PTX by its address, which `mma` rejects.
            acc[0] = mma_m16n8k32::<Acc>(
                lo.extract(2 * half),
                hi.extract(2 * half),
                lo.extract(2 * half + 1),
                hi.extract(2 * half + 1),
                bv.extract(2 * half),
                bv.extract(2 * half + 1),
                acc[0],
                plan.epi.fp8,
            );
        }
    }
}

/// Output `o` (`row * 8 + column`) of tile `t`: summed over the tile's warps in order, or, split
/// across cubes, over the cubes' slots (from `first_slot`) in order.
#[cube]
fn tile_sum<Acc: Numeric>(
    red: &[Acc],
    partials: &mut [Acc],
    first_slot: usize,
    t: usize,
    o: usize,
    #[comptime] plan: SkinnyPlan,
) -> Acc {
    let mut total = Acc::from_int(0);
    if comptime![plan.cube_splits > 1] {
        for c in 0..comptime![plan.cube_splits as usize] {
            total += partials[first_slot + c * comptime![plan.slot_len()] + t * 128 + o];
        }
    } else {
        #[unroll]
        for w in 0..comptime![plan.warps as usize] {
            total += red[(t * comptime![plan.warps as usize] + w) * 128 + o];
        }
    }
    total
}

/// `out[m, n0..n0 + 8]` for all `m < M <= 16`: m16n8 output tiles, each tile's K split over the
/// cube's warps (and, with `cube_splits > 1`, over several cubes) and summed in a fixed order.
/// Each thread loads 16 contiguous bytes of one weight row per 64-byte K chunk (a warp reads 8
/// rows x 64 bytes: whole sectors) and the same bytes of activation rows `gid` and `gid + 8`.
/// The MMA's k order is a permutation of the physical bytes (word 0/1 of a thread's vector feed
/// the first MMA, 2/3 the second), the same for A and B, so the dot products are unchanged.
/// Bandwidth-bound: the tensor cores only spare the ALUs the byte decoding (15 of 16 MMA rows
/// are padding at M = 1, and that is free).
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
    partials: &mut [Acc],
    counters: &[Atomic<u32>],
    #[comptime] plan: SkinnyPlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let m = io.m;
    let n = io.n;
    let k = io.k;
    let warps = comptime![plan.warps as usize];
    let cube_splits = comptime![plan.cube_splits as usize];
    let tid = UNIT_POS as usize;
    let warp = (tid / 32) % warps;
    let tile = tid / (32 * warps);
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    let gated = comptime![plan.epi.gate.is_some()];
    // The cubes of one tile group are consecutive: `cube_splits` shares of its K.
    let share = CUBE_POS % cube_splits;
    let block = CUBE_POS / cube_splits;
    // The weight row this lane's quad reads: plain, tile `t` of the cube covers rows
    // `8 t ..`; gated, tiles pair up (gate rows `8 p ..`, then the matching up rows `N/2` below).
    let mut n0 = (block * comptime![plan.tiles as usize] + tile) * 8;
    let mut limit = n;
    let mut row_base = 0usize;
    if gated {
        let pairs = comptime![plan.tiles as usize / 2];
        limit = n / 2;
        n0 = (block * pairs + tile / 2) * 8;
        row_base = (tile % 2) * limit;
    }
    let col_ok = n0 + gid < limit;
    let col = select(col_ok, row_base + n0 + gid, 0);

    // The first slice's weights before anything else: they do not depend on the kernel before.
    let per = comptime![plan.chunks as usize];
    let slices = k.div_ceil(64 * per);
    let stride = warps * cube_splits;
    let first = share * warps + warp;
    let mut bw = Array::<Vector<i32, Const<4>>>::new(comptime![plan.chunks as usize]);
    load_slice(&mut bw, b, col, col_ok, first, tig, k, b_pv, per);
    if comptime![plan.early_wait] {
        gpu_asm!("griddepcontrol.wait;");
    }

    let pitch_words = a_pv * 4;
    let mut codes = Shared::<[i32]>::new_slice(comptime![if plan.fused {
        FUSED_MAX_CODE_BYTES / 4
    } else {
        1
    }]);
    let mut scales = Shared::<[f32]>::new_slice(SKINNY_MAX_M);
    if comptime![plan.fused] {
        for r in 0..m {
            // With an input norm, the row's statistics first (a cube-wide sum).
            let mut inv = 1f32;
            if comptime![plan.rows.norm] {
                let row_vectors = k / plan.rows.vector;
                let mut ss = 0f32;
                for i in range_stepped(tid, row_vectors, CUBE_DIM as usize) {
                    ss += sum_squares(x[r * row_vectors + i]);
                }
                inv = f32::inverse_sqrt(cube_sum(ss, plan.rows.reduce) / k as f32 + norm_eps);
            }
            let s = row_scale::<F, NX>(x, norm_w, inv, r, k, plan.rows);
            if tid == 0 {
                scales[r] = s;
            }
            for w in range_stepped(tid, pitch_words, CUBE_DIM as usize) {
                codes[r * pitch_words + w] =
                    i32::reinterpret(encode_word::<F, NX>(x, norm_w, inv, r, w, k, s, plan.rows));
            }
        }
        sync_cube();
    }

    let mut acc = Array::<Vector<Acc, Const<4>>>::new(1usize);
    acc[0] = Vector::<Acc, Const<4>>::new(Acc::from_int(0));
    if first < slices {
        mma_slice::<Acc>(&mut acc, &bw, a, &codes, first, gid, tig, m, k, a_pv, pitch_words, plan);
    }
    for s in range_stepped(first + stride, slices, stride) {
        load_slice(&mut bw, b, col, col_ok, s, tig, k, b_pv, per);
        mma_slice::<Acc>(&mut acc, &bw, a, &codes, s, gid, tig, m, k, a_pv, pitch_words, plan);
    }
    if comptime![plan.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }

    // acc holds C[gid][2 tig + e] (e = 0, 1) and C[gid + 8][2 tig + e] (e = 2, 3).
    let mut red = Shared::<[Acc]>::new_slice(comptime![(plan.warps * plan.tiles) as usize * 128]);
    #[unroll]
    for e in 0..4usize {
        let r = gid + 8 * (e / 2);
        red[(tid / 32) * 128 + r * 8 + 2 * tig + e % 2] = acc[0].extract(e);
    }
    sync_cube();
    let first_slot = block * cube_splits * comptime![plan.slot_len()];
    let mut go = true;
    if comptime![plan.cube_splits > 1] {
        // Leave this share's tile sums in its slot; the last share of the group to finish adds
        // the slots in order.
        let mine = first_slot + share * comptime![plan.slot_len()];
        for idx in range_stepped(tid, comptime![plan.slot_len()], CUBE_DIM as usize) {
            let t = idx / 128;
            let o = idx % 128;
            let mut total = Acc::from_int(0);
            #[unroll]
            for w in 0..warps {
                total += red[(t * warps + w) * 128 + o];
            }
            partials[mine + idx] = total;
        }
        go = last_to_finish(counters, block, plan.cube_splits);
    }
    if go {
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
                let cl = (block * pairs + p) * 8 + o % 8;
                let tg = tile_sum::<Acc>(&red, partials, first_slot, 2 * p, o, plan);
                let tu = tile_sum::<Acc>(&red, partials, first_slot, 2 * p + 1, o, plan);
                if r < m && cl < n / 2 {
                    // The row's activation scale: staged by the fused kernel, else given.
                    let mut sr = scales[r];
                    if !comptime![plan.fused] {
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
                let cl = (block * comptime![plan.tiles as usize] + t) * 8 + o % 8;
                let total = tile_sum::<Acc>(&red, partials, first_slot, t, o, plan);
                if r < m && cl < n {
                    let t = f32::cast_from(total);
                    if comptime![plan.fused] {
                        write_scaled::<F>(&mut io, t * scales[r], r, cl, plan.epi);
                    } else {
                        write_output::<F>(&mut io, t, r, cl, plan.epi);
                    }
                }
            }
        }
    }
}

/// How the skinny kernel splits the work: `warps` per 8-column tile (each on a slice of up to 8
/// 64-byte chunks of K), `tiles` per cube, and `cube_splits` cubes per tile group when K has more
/// slices than a cube's warps cover and a split scratch is at hand. Every slice of K gets its
/// own warp (up to 8 per tile), so all of a small product's weight is in flight at once; without
/// a scratch the warps loop over the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SkinnyShape {
    warps: u32,
    tiles: u32,
    chunks: u32,
    cube_splits: u32,
}

impl SkinnyShape {
    /// For `n` weight rows over `k` bytes; gated, the tiles come in (gate, up) pairs.
    fn new<R: Runtime>(
        client: &ComputeClient<R>,
        n: usize,
        k: usize,
        gated: bool,
        split_k: bool,
    ) -> Self {
        let chunks = k.div_ceil(64).clamp(1, MAX_CHUNKS);
        let slices = k.div_ceil(64 * chunks);
        let (warps, cube_splits) = if slices <= 8 {
            (slices, 1)
        } else if split_k {
            let cubes = slices.div_ceil(8).min(MAX_CUBE_SPLITS);
            (slices.div_ceil(cubes).min(8), cubes)
        } else {
            (8, 1)
        };
        let warps = warps as u32;
        // About 8 warps per cube, as long as that leaves two cubes per SM (the 1.5B model's o
        // and qkv keep one tile per cube); gated, whole (gate, up) pairs.
        let unit = if gated { 2 } else { 1 };
        let units = if gated { (n / 2).div_ceil(8) } else { n.div_ceil(8) }.max(1);
        let want = 2 * caps::num_sms(client) as usize;
        let mut per_cube = ((8 / warps).max(unit) / unit).max(1) as usize;
        while per_cube > 1 && units.div_ceil(per_cube) * cube_splits < want {
            per_cube /= 2;
        }
        let tiles = (per_cube * unit as usize) as u32;
        Self {
            warps,
            tiles,
            chunks: chunks as u32,
            cube_splits: cube_splits as u32,
        }
    }

    /// Tile groups (cubes along N).
    fn blocks(&self, n: usize, gated: bool) -> usize {
        if gated {
            (n / 2).div_ceil(8).div_ceil(self.tiles as usize / 2)
        } else {
            n.div_ceil(8).div_ceil(self.tiles as usize)
        }
    }

    fn cubes(&self, n: usize, gated: bool) -> usize {
        self.blocks(n, gated) * self.cube_splits as usize
    }

    /// What a launch needs of a split scratch (4-byte accumulators).
    fn split_need(&self, n: usize, gated: bool) -> SplitNeed {
        if self.cube_splits <= 1 {
            return SplitNeed::default();
        }
        let blocks = self.blocks(n, gated);
        SplitNeed {
            partials: blocks * self.cube_splits as usize * self.tiles as usize * 128,
            counters: blocks,
        }
    }
}

/// The most the skinny kernel needs of a split scratch for a `[n_rows, k]` 8-bit weight (gated
/// or not): nothing where it does not run.
pub fn scratch_need<R: Runtime>(client: &ComputeClient<R>, n_rows: usize, k: usize) -> SplitNeed {
    if !has_mma8(client, false) && !has_mma8(client, true) {
        return SplitNeed::default();
    }
    let plain = SkinnyShape::new(client, n_rows, k, false, true).split_need(n_rows, false);
    let gated = SkinnyShape::new(client, n_rows, k, true, true).split_need(n_rows, true);
    plain.max(gated)
}

impl<R: Runtime> Gemm8<'_, R> {
    /// Whether [`Self::launch_fused`] is worth it for an activation of `rows` x `k` and `n`
    /// output columns on this runtime: the codes fit in shared memory, and the redundant
    /// quantization (every cube redoes it) stays below ~2M element encodes; past that (e.g. the
    /// 1.5B model's gate_up and lm_head at M = 1, measured on an H100) the pre-pass is faster.
    pub(crate) fn can_fuse(
        client: &ComputeClient<R>,
        fp8: bool,
        rows: usize,
        k: usize,
        n: usize,
    ) -> bool {
        // The fused decision is made without the gate (a gated launch has the same cube count)
        // and with the split across cubes, so that it does not depend on the scratch at hand.
        let cubes = SkinnyShape::new(client, n, k, false, true).cubes(n, false);
        has_mma8(client, fp8)
            && rows <= SKINNY_MAX_M
            && rows * crate::format::row_pitch(k) <= FUSED_MAX_CODE_BYTES
            && cubes * rows * k <= 2 << 20
    }

    /// The skinny kernel quantizing the float activation `x` (`[M, K]`, contiguous) itself; `a`
    /// and `sa` are not read. Only where [`Self::can_fuse`] holds.
    pub(crate) fn launch_fused(&self, client: &ComputeClient<R>, x: &DeviceTensor<R>) {
        debug_assert!(Self::can_fuse(client, self.fp8, self.m, self.k, self.n));
        self.launch_skinny(client, Some(x));
    }

    /// The skinny tensor-core kernel (M <= 16), reading codes from `a` or, fused, quantizing `x`;
    /// K split across cubes where [`Gemm8::split`] has room for it.
    pub(super) fn launch_skinny(&self, client: &ComputeClient<R>, x: Option<&DeviceTensor<R>>) {
        let gated = self.gate.is_some();
        let mut shape = SkinnyShape::new(client, self.n, self.k, gated, self.split.is_some());
        let split = match self.split {
            Some(s) if shape.cube_splits > 1 && s.fits(shape.split_need(self.n, gated)) => Some(s),
            _ => {
                // No scratch, or one too small: K stays in one cube.
                shape = SkinnyShape::new(client, self.n, self.k, gated, false);
                None
            }
        };
        let (warps, tiles) = (shape.warps, shape.tiles);
        let format = if self.fp8 {
            QuantFormat::Fp8E4M3
        } else {
            QuantFormat::Int8
        };
        // Unfused, `x` is never read: bind the output (CUDA only, where aliasing is allowed).
        let xt = x.unwrap_or(self.out);
        let mut rows = RowQuantPlan::new(client, xt, format, 32 * warps * tiles);
        rows.norm = self.norm.is_some();
        debug_assert!(
            !rows.norm || x.is_some(),
            "the input norm needs the fused kernel"
        );
        let plan = SkinnyPlan {
            epi: self.epilogue_plan(),
            warps,
            tiles,
            chunks: shape.chunks,
            cube_splits: shape.cube_splits,
            fused: x.is_some(),
            rows,
            early_wait: caps::has_pdl(client),
            trigger: caps::has_launch_dependents(client),
        };
        // Without a norm its weight is never read: bind x.
        let (norm_w, norm_eps) = match self.norm {
            Some(n) => (n.weight, n.eps),
            None => (xt, 0.0),
        };
        // Without a split the scratch operands are bound to the row scales (never read then).
        let (partials, counters) = match split {
            Some(s) => unsafe { (s.partials_arg(), s.counters_arg()) },
            None => unsafe { (self.sa.as_buffer_arg(), self.sa.as_buffer_arg()) },
        };
        unsafe {
            gemm8_skinny_kernel::launch_unchecked::<R>(
                client,
                ops::launch::cube_count_1d(client, shape.cubes(self.n, gated) as u32),
                CubeDim::new_1d(32 * warps * tiles),
                plan.rows.vector,
                self.vec_arg(self.a),
                xt.as_buffer_arg(),
                self.vec_arg(self.b),
                self.out_arg(),
                norm_w.as_buffer_arg(),
                norm_eps,
                self.a_pitch / 16,
                self.b_pitch / 16,
                partials,
                counters,
                plan,
                self.dtypes(),
            );
        }
    }
}
