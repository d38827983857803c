//! The skinny tensor-core kernel for M <= 16 (CUDA, decode): m16n8 output tiles, K split over up
//! to 16 warps per tile where the tiles are few, operands loaded straight from global memory
//! into fragments, the K slices summed at the end; optionally quantizing the activation itself.

use cubecl::prelude::*;
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
/// 64-byte K chunks a skinny-kernel warp loads per step (4 measured slower on an H100: gate_up
/// 11.7 -> 16.8 µs at M = 1).
const CHUNKS_PER_STEP: usize = 2;
/// Bytes of activation codes the fused skinny kernel stages in shared memory (rows x padded K):
/// up to this, the linear layers quantize the activation inside the GEMM instead of a pre-pass.
pub(crate) const FUSED_MAX_CODE_BYTES: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SkinnyPlan {
    pub epi: EpiloguePlan,
    /// Warps per output tile; they split K.
    pub warps: u32,
    /// Output tiles (of 8 columns) per cube.
    pub tiles: u32,
    /// Quantize x in the kernel: every cube computes the row scales and stages the codes in
    /// shared memory (the same functions as the pre-pass, so the same bytes), saving a launch.
    pub fused: bool,
    /// How the fused kernel reads and encodes x.
    pub rows: RowQuantPlan,
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

/// `out[m, n0..n0 + 8]` for all `m < M <= 16`: one m16n8 output tile per cube, its K split over
/// the cube's warps and summed through shared memory. Each thread loads 16 contiguous bytes of
/// one weight row per 64-byte K chunk (a warp reads 8 rows x 64 bytes: whole sectors) and the
/// same bytes of activation rows `gid` and `gid + 8`. The MMA's k order is a permutation of the
/// physical bytes (word 0/1 of a thread's vector feed the first MMA, 2/3 the second), the same
/// for A and B, so the dot products are unchanged. Bandwidth-bound: the tensor cores only spare
/// the ALUs the byte decoding (15 of 16 MMA rows are padding at M = 1, and that is free).
#[cube(launch_unchecked)]
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
    let tid = UNIT_POS as usize;
    let warp = (tid / 32) % warps;
    let tile = tid / (32 * warps);
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    let gated = comptime![plan.epi.gate.is_some()];
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
    let lo_ok = gid < m;
    let hi_ok = gid + 8 < m;

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
    let chunks = k.div_ceil(64);
    // CHUNKS_PER_STEP chunks per step, all loaded before any is multiplied: more bytes in
    // flight (a loop iteration's loads are otherwise one memory latency each).
    for c in range_stepped(warp, chunks, CHUNKS_PER_STEP * warps) {
        let mut words = Array::<Vector<i32, Const<4>>>::new(comptime![3 * CHUNKS_PER_STEP]);
        #[unroll]
        for h in 0..CHUNKS_PER_STEP {
            let byte = (c + h * warps) * 64 + tig * 16;
            words[3 * h] = load_vec(b, col, col_ok, byte, k, b_pv);
            if comptime![plan.fused] {
                words[3 * h + 1] = load_staged(&codes, gid, lo_ok, byte, k, pitch_words);
                words[3 * h + 2] = load_staged(&codes, gid + 8, hi_ok, byte, k, pitch_words);
            } else {
                words[3 * h + 1] = load_vec(a, gid, lo_ok, byte, k, a_pv);
                words[3 * h + 2] = load_vec(a, gid + 8, hi_ok, byte, k, a_pv);
            }
        }
        #[unroll]
        for h in 0..CHUNKS_PER_STEP {
            let bw = words[3 * h];
            let lo = words[3 * h + 1];
            let hi = words[3 * h + 2];
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

    // acc[0] holds C[gid][2 tig + e] (e = 0, 1) and C[gid + 8][2 tig + e] (e = 2, 3).
    let mut red = Shared::<[Acc]>::new_slice(comptime![(plan.warps * plan.tiles) as usize * 128]);
    let cv = acc[0];
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
            let cl = (CUBE_POS * comptime![plan.tiles as usize] + t) * 8 + o % 8;
            let mut total = Acc::from_int(0);
            #[unroll]
            for w in 0..warps {
                total += red[(t * warps + w) * 128 + o];
            }
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

/// How the skinny kernel splits the work: `warps` per 8-column tile (splitting K) and `tiles`
/// per cube (256 threads, 512 with 16 warps). Enough warps overall to cover the memory latency (about 32 per SM),
/// and no K split where the tiles alone provide them (the 1.5B model's lm_head has 18992).
#[derive(Clone, Copy, Debug)]
struct SkinnyShape {
    warps: u32,
    tiles: u32,
}

impl SkinnyShape {
    /// For `n` weight rows; gated, the tiles come in (gate, up) pairs, at least one per cube.
    fn new<R: Runtime>(client: &ComputeClient<R>, n: usize, gated: bool) -> Self {
        let tiles = n.div_ceil(8).max(1);
        let want = 32 * caps::num_sms(client).max(1) as usize;
        let warps = want.div_ceil(tiles).next_power_of_two().clamp(1, 16) as u32;
        let per_cube = (8 / warps).max(1);
        if gated && per_cube < 2 {
            // Two tiles of 8 warps: the cube keeps its 512 units.
            return Self {
                warps: warps.min(8),
                tiles: 2,
            };
        }
        Self {
            warps,
            tiles: per_cube,
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
        // The fused decision is made without the gate: a gated launch has the same cube count.
        let cubes = SkinnyShape::new(client, n, false).cubes(n, false);
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

    /// The skinny tensor-core kernel (M <= 16), reading codes from `a` or, fused, quantizing `x`.
    pub(super) fn launch_skinny(&self, client: &ComputeClient<R>, x: Option<&DeviceTensor<R>>) {
        let gated = self.gate.is_some();
        let shape = SkinnyShape::new(client, self.n, gated);
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
            fused: x.is_some(),
            rows,
        };
        // Without a norm its weight is never read: bind x.
        let (norm_w, norm_eps) = match self.norm {
            Some(n) => (n.weight, n.eps),
            None => (xt, 0.0),
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
                plan,
                self.dtypes(),
            );
        }
    }
}
