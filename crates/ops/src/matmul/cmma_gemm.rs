//! Tensor-core GEMM for f16/bf16 through CubeCL's `cmma` (warp-level 16x16x16 fragments with
//! f32 accumulators; `wmma`/`mma.sync` on NVIDIA).
//!
//! Each cube (`warps_m x warps_n` planes) owns a `BM x BN` tile of y and walks K in steps of
//! `BK` (32 or 64) through `stages` shared-memory buffers; each plane accumulates a
//! `(BM / warps_m) x (BN / warps_n)` block as a grid of 16x16 fragments, so that every A and B
//! fragment it loads feeds several MMAs. Both operands are K-contiguous in shared memory (x as
//! `[BM][BK]` row-major, the rows of w as `[BN][BK]`, which is exactly the column-major B
//! operand), rows padded by 8 elements: a pitch of `BK + 8` elements is an odd multiple of 16
//! bytes, so the 8 rows of an 8x8 fragment load and the 16-byte copies into a row land in
//! different bank groups.
//!
//! Two ways to fill the buffers (the comptime `stages`):
//! - `stages >= 2`, the default on CUDA (sm_80+: `features.copy_async`) when a row of K is a
//!   multiple of 4 bytes: a `cp.async` pipeline. The copies of step `t + stages - 1` are in
//!   flight while step `t` is computed. Each stage has an mbarrier (arrival count: the whole
//!   cube); every unit commits its copies to the stage's barrier (`commit_copy_async`, which
//!   is not an arrival) and later `arrive_and_wait`s on it before reading the stage. Passing
//!   that wait also proves that every plane has finished the previous step, so the stage that
//!   step read can be overwritten by the next copies without a `sync_cube`. Copies outside the
//!   matrix (M, N or K tails) are zero-filled by the copy itself (source size 0). No registers
//!   are spent on staging.
//! - `stages == 0` (runtimes without async copies, and odd K where a vector is 2 bytes): the
//!   next step is loaded into registers while the tensor cores work on the current buffer,
//!   then stored into the other one (double buffer, one `sync_cube` per step).
//!
//! The tile shape is picked per problem (see [`CmmaTile::auto`]): 128x128 with 4 planes of
//! 64x64 (8 planes of 64x32 for the gated MLP; a 4-stage pipeline when K >= 4096) when that
//! gives about one cube per SM, else 64x64, so that the small prefill projections still fill
//! the GPU (an H100 sweep chose these; BENCHMARKS.md). `CUBELLM_GEMM_TUNE` overrides it for
//! benchmark sweeps (see [`CmmaTile::from_env`]).
//!
//! The gated MLP packs both weights into one B tile: its first `BN / 2` rows are gate rows, the
//! other half the matching up rows, so a tile covers `BN / 2` output columns and each plane owns
//! as many gate fragments as up fragments for the same columns.
//!
//! The epilogue goes through a 16x16 f32 scratch per plane (two when gated): the fragment is
//! stored there, each lane then takes 8 consecutive elements of a row, applies the gated
//! activation (gate and up rounded to the dtype first, as an unfused MLP would), adds bias and
//! residual, rounds once and writes with bounds. Tiles are visited in grouped order (`GROUP_M`
//! tile rows at a time) for L2 reuse of w.

use std::sync::OnceLock;

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::barrier::{copy_async_checked, Barrier};
use cubecl::prelude::*;

use super::gemv::activation;
use super::tiled::grouped_tile;
use super::{Activation, Problem};
use crate::{caps, DType, DeviceTensor, OpsError, Result};

const PAD: usize = 8;
const FRAG: usize = 16;
const PLANE: usize = 32;
const GROUP_M: u32 = 8;

/// The name of the tuning override (benchmark sweeps only).
pub const TUNE_ENV: &str = "CUBELLM_GEMM_TUNE";

/// The shape of one tensor-core GEMM launch: the cube's tile, its planes and the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmmaTile {
    /// Rows of x per tile.
    pub bm: u32,
    /// Rows of w per tile: the output columns of a plain GEMM; for the gated MLP half of them
    /// are gate rows and half up rows, so a tile covers `bn / 2` output columns.
    pub bn: u32,
    /// K per pipeline step: 32 or 64.
    pub bk: u32,
    pub warps_m: u32,
    pub warps_n: u32,
    /// `cp.async` pipeline depth (2 to 8), or 0 for the register-staged double buffer.
    pub stages: u32,
}

impl CmmaTile {
    /// 128x128, 4 planes of 64x64, BK = 32, 3 stages: the default for large plain GEMMs (the
    /// H100 sweep in BENCHMARKS.md: ahead of 8 planes of 64x32 by 5-20%, a 64x64 plane tile
    /// reads half the shared memory per `mma`).
    pub const LARGE: Self = Self::new(128, 128, 2, 2, 3);
    /// [`LARGE`](Self::LARGE) with a 4-stage pipeline: the long-K (>= 4096) shapes.
    pub const LARGE_DEEP: Self = Self::new(128, 128, 2, 2, 4);
    /// 128x128, 8 planes of 64x32: the gated MLP (gate and up fragments per plane), where it
    /// measured ahead of the 4-plane tile.
    pub const LARGE_GATED: Self = Self::new(128, 128, 2, 4, 3);
    /// 64x128, 8 planes of 32x32.
    pub const MEDIUM: Self = Self::new(64, 128, 2, 4, 3);
    /// 64x64, 4 planes of 32x32: where 128x128 tiles cannot fill the SMs (the 1.5B model's
    /// qkv/o/down projections at M = 512: 1.4-1.8x faster there than 128x128).
    pub const SMALL: Self = Self::new(64, 64, 2, 2, 3);

    /// A tile with `BK = 32`.
    pub const fn new(bm: u32, bn: u32, warps_m: u32, warps_n: u32, stages: u32) -> Self {
        Self {
            bm,
            bn,
            bk: 32,
            warps_m,
            warps_n,
            stages,
        }
    }

    /// The same tile with another `BK`.
    pub const fn with_bk(self, bk: u32) -> Self {
        Self { bk, ..self }
    }

    pub fn units(&self) -> u32 {
        self.warps_m * self.warps_n * PLANE as u32
    }

    /// Output columns one tile covers.
    pub fn out_cols(&self, gated: bool) -> usize {
        if gated {
            self.bn as usize / 2
        } else {
            self.bn as usize
        }
    }

    /// Whether the kernel can run this tile (plane blocks whole fragments, and for the gated
    /// MLP an even number of B fragments per plane: gate and up halves).
    pub fn is_valid(&self, gated: bool) -> bool {
        let planes = self.warps_m * self.warps_n;
        if self.warps_m == 0 || self.warps_n == 0 || planes > 32 || self.bm == 0 || self.bn == 0 {
            return false;
        }
        let (pm, pn) = (self.bm / self.warps_m, self.bn / self.warps_n);
        self.bm.is_multiple_of(self.warps_m)
            && self.bn.is_multiple_of(self.warps_n)
            && pm.is_multiple_of(FRAG as u32)
            && pn.is_multiple_of(FRAG as u32)
            && (!gated || (pn / FRAG as u32).is_multiple_of(2))
            && (pm / FRAG as u32) * (pn / FRAG as u32) <= 32
            && (self.bk == 32 || self.bk == 64)
            && (self.stages == 0 || (2..=8).contains(&self.stages))
    }

    /// Buffers of shared memory (the register path double-buffers).
    fn buffers(&self) -> usize {
        if self.stages == 0 {
            2
        } else {
            self.stages as usize
        }
    }

    /// Shared memory one cube uses, in bytes, for `elem` bytes per element.
    pub fn shared_bytes(&self, elem: usize, gated: bool) -> usize {
        let stages = self.buffers() * (self.bm + self.bn) as usize * (self.bk as usize + PAD);
        let scratch = if gated { 2 } else { 1 } * FRAG * FRAG * 4;
        stages * elem + scratch * (self.warps_m * self.warps_n) as usize + 64 * self.buffers()
    }

    /// Parses `bm,bn,warps_m,warps_n,stages[,bk]` (the syntax of [`TUNE_ENV`]).
    pub fn parse(text: &str) -> Option<Self> {
        let v: Vec<u32> = text
            .split(',')
            .map(|s| s.trim().parse().ok())
            .collect::<Option<_>>()?;
        let tile = match v[..] {
            [bm, bn, wm, wn, st] => Self::new(bm, bn, wm, wn, st),
            [bm, bn, wm, wn, st, bk] => Self::new(bm, bn, wm, wn, st).with_bk(bk),
            _ => return None,
        };
        tile.is_valid(false).then_some(tile)
    }

    /// The tile [`TUNE_ENV`] asks for, read once per process. Invalid text is reported once on
    /// stderr and ignored (the per-shape default applies).
    pub fn from_env() -> Option<Self> {
        static TUNE: OnceLock<Option<CmmaTile>> = OnceLock::new();
        *TUNE.get_or_init(|| {
            let text = std::env::var(TUNE_ENV).ok()?;
            let tile = Self::parse(&text);
            if tile.is_none() && !text.trim().is_empty() {
                eprintln!(
                    "{TUNE_ENV}={text:?} ignored: expected bm,bn,warps_m,warps_n,stages[,bk] \
                     describing a valid tile (e.g. 128,128,2,4,3)"
                );
            }
            tile
        })
    }

    /// The default tile for an `m x n` output with inner dimension `k` on `sms` SMs: 128x128
    /// when that gives at least ~3/4 of a cube per SM (deeper pipeline for K >= 4096, 8 planes
    /// when gated), else [`SMALL`](Self::SMALL). Measured on an H100 (BENCHMARKS.md).
    pub fn auto(m: usize, n: usize, k: usize, gated: bool, sms: usize) -> Self {
        let large = match (gated, k >= 4096) {
            (true, _) => Self::LARGE_GATED,
            (false, true) => Self::LARGE_DEEP,
            (false, false) => Self::LARGE,
        };
        let tiles = m.div_ceil(large.bm as usize) * n.div_ceil(large.out_cols(gated));
        if 4 * tiles >= 3 * sms {
            large
        } else {
            Self::SMALL
        }
    }
}

/// Comptime configuration (the kernel's compile key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmmaPlan {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub warps_m: u32,
    pub warps_n: u32,
    pub stages: u32,
    /// Elements per vector of x and w (the kernel's `N`).
    pub vector: u32,
    pub group_m: u32,
    pub has_bias: bool,
    pub has_residual: bool,
    pub gated: bool,
    pub gelu: bool,
}

impl CmmaPlan {
    fn units(&self) -> usize {
        (self.warps_m * self.warps_n) as usize * PLANE
    }
    fn ldk(&self) -> usize {
        self.bk as usize + PAD
    }
    /// Vectors per shared row.
    fn pitch(&self) -> usize {
        self.ldk() / self.vector as usize
    }
    /// Vectors of one step of K per row.
    fn row_vectors(&self) -> usize {
        self.bk as usize / self.vector as usize
    }
    fn a_stage(&self) -> usize {
        self.bm as usize * self.pitch()
    }
    fn b_stage(&self) -> usize {
        self.bn as usize * self.pitch()
    }
    fn buffers(&self) -> usize {
        if self.stages == 0 {
            2
        } else {
            self.stages as usize
        }
    }
    /// Vectors each unit moves per step, for A and for B: `(total, per unit)`.
    fn a_copies(&self) -> (usize, usize) {
        let total = self.bm as usize * self.row_vectors();
        (total, total.div_ceil(self.units()))
    }
    fn b_copies(&self) -> (usize, usize) {
        let total = self.bn as usize * self.row_vectors();
        (total, total.div_ceil(self.units()))
    }
    fn plane_rows(&self) -> usize {
        (self.bm / self.warps_m) as usize
    }
    fn plane_cols(&self) -> usize {
        (self.bn / self.warps_n) as usize
    }
    fn frags_m(&self) -> usize {
        self.plane_rows() / FRAG
    }
    /// B fragments per plane (gate and up together when gated).
    fn frags_n(&self) -> usize {
        self.plane_cols() / FRAG
    }
    /// Output fragments per plane along N.
    fn out_frags_n(&self) -> usize {
        if self.gated {
            self.frags_n() / 2
        } else {
            self.frags_n()
        }
    }
    /// The B-tile row of plane 0's `j`-th B fragment (plane `wn` adds `wn * b_plane_step`).
    fn frag_b_row(&self, j: usize) -> usize {
        if self.gated {
            let half = self.frags_n() / 2;
            if j < half {
                j * FRAG
            } else {
                self.bn as usize / 2 + (j - half) * FRAG
            }
        } else {
            j * FRAG
        }
    }
    /// B rows (and output columns, see `out_plane_step`) between neighbouring planes along N.
    fn b_plane_step(&self) -> usize {
        if self.gated {
            self.plane_cols() / 2
        } else {
            self.plane_cols()
        }
    }
    fn out_cols(&self) -> usize {
        if self.gated {
            self.bn as usize / 2
        } else {
            self.bn as usize
        }
    }
    /// Length of the shared slice a fragment load covers, in vectors.
    fn frag_len(&self) -> usize {
        ((FRAG - 1) * self.ldk() + FRAG) / self.vector as usize
    }
}

/// Whether the runtime has 16x16x16 fragments of `dtype` with f32 accumulation.
pub(crate) fn supported<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    let kind = match dtype {
        DType::F16 => FloatKind::F16,
        DType::BF16 => FloatKind::BF16,
        _ => return false,
    };
    if caps::plane_size_min(client) != 32 || client.properties().hardware.plane_size_max != 32 {
        return false;
    }
    let want = ElemType::Float(kind);
    let acc = ElemType::Float(FloatKind::F32);
    client.features().matmul.cmma.iter().any(|c: &MmaConfig| {
        c.a_type == want
            && c.b_type == want
            && c.cd_type == acc
            && c.m == 16
            && c.n == 16
            && c.k == 16
    })
}

/// Where row `r` of a B tile lives: (vector offset of the row in its matrix, whether the row
/// exists, whether it is in the up matrix). Plain: row `n0 + r` of w. Gated: rows below
/// `bn / 2` are gate rows `n0 + r`, the others up rows `up_offset + n0 + r - bn / 2`.
#[cube]
fn b_row(
    r: usize,
    n0: usize,
    n: usize,
    up_offset: usize,
    k_vecs: usize,
    #[comptime] plan: CmmaPlan,
) -> (usize, bool, bool) {
    let mut col = n0 + r;
    let mut is_up = false;
    let mut offset = 0usize;
    if comptime![plan.gated] {
        let half = comptime![plan.bn as usize / 2];
        if r >= half {
            col = n0 + r - half;
            is_up = true;
            offset = up_offset;
        }
    }
    ((offset + col) * k_vecs, col < n, is_up)
}

/// Loads one K step of A (`bm` rows of x) and B (`bn` weight rows) into registers, zero outside
/// the matrices.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_step<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<F, N>],
    w_up: &[Vector<F, N>],
    regs: &mut Array<Vector<F, N>>,
    m0: usize,
    n0: usize,
    k0v: usize,
    m: usize,
    n: usize,
    k_vecs: usize,
    up_offset: usize,
    #[comptime] plan: CmmaPlan,
) {
    let per_row = comptime![plan.row_vectors()];
    let units = comptime![plan.units()];
    let (a_total, a_iters) = comptime![plan.a_copies()];
    let (b_total, b_iters) = comptime![plan.b_copies()];
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..a_iters {
        let idx = unit + i * units;
        let r = idx / per_row;
        let kv = k0v + idx % per_row;
        let mut v = Vector::<F, N>::new(F::new(0.0));
        if idx < a_total && m0 + r < m && kv < k_vecs {
            v = x[(m0 + r) * k_vecs + kv];
        }
        regs[i] = v;
    }
    #[unroll]
    for i in 0..b_iters {
        let idx = unit + i * units;
        let r = idx / per_row;
        let kv = k0v + idx % per_row;
        let (start, exists, is_up) = b_row(r, n0, n, up_offset, k_vecs, plan);
        let mut v = Vector::<F, N>::new(F::new(0.0));
        if idx < b_total && exists && kv < k_vecs {
            if is_up {
                v = w_up[start + kv];
            } else {
                v = w[start + kv];
            }
        }
        regs[a_iters + i] = v;
    }
}

/// Writes the registers of [`load_step`] into buffer `buf`.
#[cube]
fn store_step<F: Float, N: Size>(
    regs: &Array<Vector<F, N>>,
    a_s: &mut [Vector<F, N>],
    b_s: &mut [Vector<F, N>],
    buf: usize,
    #[comptime] plan: CmmaPlan,
) {
    let per_row = comptime![plan.row_vectors()];
    let pitch = comptime![plan.pitch()];
    let units = comptime![plan.units()];
    let (a_total, a_iters) = comptime![plan.a_copies()];
    let (b_total, b_iters) = comptime![plan.b_copies()];
    let a_base = buf * comptime![plan.a_stage()];
    let b_base = buf * comptime![plan.b_stage()];
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..a_iters {
        let idx = unit + i * units;
        if idx < a_total {
            a_s[a_base + (idx / per_row) * pitch + idx % per_row] = regs[i];
        }
    }
    #[unroll]
    for i in 0..b_iters {
        let idx = unit + i * units;
        if idx < b_total {
            b_s[b_base + (idx / per_row) * pitch + idx % per_row] = regs[a_iters + i];
        }
    }
}

/// Starts the `cp.async` copies of one K step into stage `stage`: one vector (4, 8 or 16
/// bytes) per copy; vectors outside the matrices are zero-filled by the copy (source size 0,
/// source address clamped to the buffer's start).
#[cube]
#[allow(clippy::too_many_arguments)]
fn issue_step<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<F, N>],
    w_up: &[Vector<F, N>],
    a_s: &mut [Vector<F, N>],
    b_s: &mut [Vector<F, N>],
    stage: usize,
    m0: usize,
    n0: usize,
    k0v: usize,
    m: usize,
    n: usize,
    k_vecs: usize,
    up_offset: usize,
    #[comptime] plan: CmmaPlan,
) {
    let vector = comptime![plan.vector];
    let per_row = comptime![plan.row_vectors()];
    let pitch = comptime![plan.pitch()];
    let units = comptime![plan.units()];
    let (a_total, a_iters) = comptime![plan.a_copies()];
    let (b_total, b_iters) = comptime![plan.b_copies()];
    let a_base = stage * comptime![plan.a_stage()];
    let b_base = stage * comptime![plan.b_stage()];
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..a_iters {
        let idx = unit + i * units;
        if idx < a_total {
            let r = idx / per_row;
            let kv = k0v + idx % per_row;
            let ok = m0 + r < m && kv < k_vecs;
            let src = select(ok, (m0 + r) * k_vecs + kv, 0usize);
            let len = select(ok, 1usize, 0usize);
            let dst = a_base + r * pitch + idx % per_row;
            copy_async_checked(&x[src..src + len], &mut a_s[dst..dst + 1], vector);
        }
    }
    #[unroll]
    for i in 0..b_iters {
        let idx = unit + i * units;
        if idx < b_total {
            let r = idx / per_row;
            let kv = k0v + idx % per_row;
            let (start, exists, is_up) = b_row(r, n0, n, up_offset, k_vecs, plan);
            let ok = exists && kv < k_vecs;
            let src = select(ok, start + kv, 0usize);
            let len = select(ok, 1usize, 0usize);
            let dst = b_base + r * pitch + idx % per_row;
            if is_up {
                copy_async_checked(&w_up[src..src + len], &mut b_s[dst..dst + 1], vector);
            } else {
                copy_async_checked(&w[src..src + len], &mut b_s[dst..dst + 1], vector);
            }
        }
    }
}

/// One K step of tensor-core work on buffer `buf`: every plane multiplies its fragments.
#[cube]
#[allow(clippy::too_many_arguments)]
fn compute_step<F: Float, N: Size>(
    a_s: &[Vector<F, N>],
    b_s: &[Vector<F, N>],
    accs: &mut Sequence<cmma::Matrix<f32>>,
    a_frags: &mut Sequence<cmma::Matrix<F>>,
    b_frag: &mut cmma::Matrix<F>,
    buf: usize,
    wm: usize,
    wn: usize,
    #[comptime] plan: CmmaPlan,
) {
    let vector = comptime![plan.vector as usize];
    let ldk = comptime![plan.ldk()];
    let fm = comptime![plan.frags_m()];
    let fnn = comptime![plan.frags_n()];
    let frag_len = comptime![plan.frag_len()];
    let a_base = buf * comptime![plan.a_stage()] + wm * comptime![plan.plane_rows() * plan.pitch()];
    let b_base =
        buf * comptime![plan.b_stage()] + wn * comptime![plan.b_plane_step() * plan.pitch()];
    #[unroll]
    for kk in 0..comptime![plan.bk as usize / FRAG] {
        #[unroll]
        for i in 0..fm {
            let start = a_base + comptime![(i * FRAG * ldk + kk * FRAG) / vector];
            cmma::load(
                a_frags.index_mut(i),
                &a_s[start..start + frag_len],
                ldk as u32,
            );
        }
        #[unroll]
        for j in 0..fnn {
            let start = b_base + comptime![(plan.frag_b_row(j) * ldk + kk * FRAG) / vector];
            cmma::load(b_frag, &b_s[start..start + frag_len], ldk as u32);
            #[unroll]
            for i in 0..fm {
                let acc = accs.index(i * fnn + j);
                cmma::execute(a_frags.index(i), &*b_frag, acc, acc);
            }
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cmma_gemm_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<F, N>],
    w_up: &[Vector<F, N>],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n_total: usize,
    k: usize,
    up_row_offset: usize,
    tiles_m: usize,
    tiles_n: usize,
    #[comptime] plan: CmmaPlan,
    #[define(F)] _dtype: ElemType,
) {
    if CUBE_POS >= tiles_m * tiles_n {
        terminate!();
    }
    let (tile_m, tile_n) = grouped_tile(CUBE_POS, tiles_m, tiles_n, plan.group_m);
    let m0 = tile_m * comptime![plan.bm as usize];
    let n0 = tile_n * comptime![plan.out_cols()];
    let plane = UNIT_POS as usize / PLANE;
    let lane = UNIT_POS as usize % PLANE;
    let wm = plane / comptime![plan.warps_n as usize];
    let wn = plane % comptime![plan.warps_n as usize];
    let fm = comptime![plan.frags_m()];
    let fnn = comptime![plan.frags_n()];
    let k_vecs = k / comptime![plan.vector as usize];
    let step_v = comptime![plan.row_vectors()];

    let nbuf = comptime![plan.buffers()];
    let mut a_s =
        Shared::<[Vector<F, N>]>::new_aligned_slice(comptime![nbuf * plan.a_stage()], 128usize);
    let mut b_s =
        Shared::<[Vector<F, N>]>::new_aligned_slice(comptime![nbuf * plan.b_stage()], 128usize);

    let mut accs = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..fm * fnn {
        accs.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            FRAG,
            FRAG,
            FRAG,
            cmma::MatrixLayout::Undefined,
            0f32,
        ));
    }
    let mut a_frags = Sequence::<cmma::Matrix<F>>::new();
    #[unroll]
    for _ in 0..fm {
        a_frags.push(unsafe {
            cmma::Matrix::<F>::uninitialized(
                cmma::MatrixIdent::A,
                FRAG,
                FRAG,
                FRAG,
                cmma::MatrixLayout::RowMajor,
            )
        });
    }
    let mut b_frag = unsafe {
        cmma::Matrix::<F>::uninitialized(
            cmma::MatrixIdent::B,
            FRAG,
            FRAG,
            FRAG,
            cmma::MatrixLayout::ColMajor,
        )
    };

    let steps = k.div_ceil(comptime![plan.bk as usize]);
    if comptime![plan.stages >= 2] {
        let depth = comptime![plan.stages as usize];
        let mut bars = Sequence::<Shared<Barrier>>::new();
        #[unroll]
        for _ in 0..depth {
            bars.push(Barrier::shared(CUBE_DIM, UNIT_POS == 0));
        }
        // Prologue: steps 0 .. depth - 1 in flight.
        #[unroll]
        for s in 0..depth - 1 {
            if s < steps {
                issue_step(
                    x,
                    w,
                    w_up,
                    &mut a_s,
                    &mut b_s,
                    s,
                    m0,
                    n0,
                    s * step_v,
                    m,
                    n_total,
                    k_vecs,
                    up_row_offset,
                    plan,
                );
            }
            bars.index(s).commit_copy_async();
        }
        // Step t reads stage t % depth; unrolled by `depth` so that every barrier index is
        // comptime.
        for t0 in range_stepped(0, steps, depth) {
            #[unroll]
            for s in 0..depth {
                let t = t0 + s;
                if t < steps {
                    bars.index(s).arrive_and_wait();
                    // Every unit is past step t - 1 (it arrived above only after computing
                    // it), so the stage that step read is free for step t + depth - 1.
                    let next = comptime![(s + depth - 1) % depth];
                    let nt = t + depth - 1;
                    if nt < steps {
                        issue_step(
                            x,
                            w,
                            w_up,
                            &mut a_s,
                            &mut b_s,
                            next,
                            m0,
                            n0,
                            nt * step_v,
                            m,
                            n_total,
                            k_vecs,
                            up_row_offset,
                            plan,
                        );
                    }
                    bars.index(next).commit_copy_async();
                    compute_step(
                        &a_s,
                        &b_s,
                        &mut accs,
                        &mut a_frags,
                        &mut b_frag,
                        s,
                        wm,
                        wn,
                        plan,
                    );
                }
            }
        }
    } else {
        let (_a_total, a_iters) = comptime![plan.a_copies()];
        let (_b_total, b_iters) = comptime![plan.b_copies()];
        let mut regs = Array::<Vector<F, N>>::new(comptime![a_iters + b_iters]);
        load_step(
            x,
            w,
            w_up,
            &mut regs,
            m0,
            n0,
            0,
            m,
            n_total,
            k_vecs,
            up_row_offset,
            plan,
        );
        store_step(&regs, &mut a_s, &mut b_s, 0, plan);
        sync_cube();
        for step in 0..steps {
            let buf = step % 2;
            let has_next = step + 1 < steps;
            if has_next {
                load_step(
                    x,
                    w,
                    w_up,
                    &mut regs,
                    m0,
                    n0,
                    (step + 1) * step_v,
                    m,
                    n_total,
                    k_vecs,
                    up_row_offset,
                    plan,
                );
            }
            compute_step(
                &a_s,
                &b_s,
                &mut accs,
                &mut a_frags,
                &mut b_frag,
                buf,
                wm,
                wn,
                plan,
            );
            if has_next {
                store_step(&regs, &mut a_s, &mut b_s, 1 - buf, plan);
            }
            sync_cube();
        }
    }

    // Epilogue: fragment(s) -> per-plane scratch -> global, 8 consecutive columns per lane.
    let frag_elems = FRAG * FRAG;
    let per_plane = comptime![if plan.gated {
        2 * FRAG * FRAG
    } else {
        FRAG * FRAG
    }];
    let mut scratch = Shared::<[f32]>::new_aligned_slice(
        comptime![per_plane * (plan.warps_m * plan.warps_n) as usize],
        128usize,
    );
    let s0 = plane * per_plane;
    let r_in = lane / 2;
    let c_in = (lane % 2) * 8;
    let ofn = comptime![plan.out_frags_n()];
    #[unroll]
    for i in 0..fm {
        #[unroll]
        for j in 0..ofn {
            cmma::store(
                &mut scratch[s0..s0 + frag_elems],
                accs.index(i * fnn + j),
                FRAG as u32,
                cmma::MatrixLayout::RowMajor,
            );
            if comptime![plan.gated] {
                cmma::store(
                    &mut scratch[s0 + frag_elems..s0 + 2 * frag_elems],
                    accs.index(i * fnn + j + ofn),
                    FRAG as u32,
                    cmma::MatrixLayout::RowMajor,
                );
            }
            sync_plane();
            let row = m0 + wm * comptime![plan.plane_rows()] + i * FRAG + r_in;
            let col_base = n0 + wn * comptime![plan.b_plane_step()] + j * FRAG + c_in;
            if row < m {
                #[unroll]
                for c in 0..8usize {
                    let col = col_base + c;
                    if col < n_total {
                        let at = s0 + r_in * FRAG + c_in + c;
                        let mut y = scratch[at];
                        if comptime![plan.gated] {
                            // Gate and up rounded to the dtype, as an unfused MLP sees them.
                            let g = f32::cast_from(F::cast_from(y));
                            let u = f32::cast_from(F::cast_from(scratch[at + frag_elems]));
                            y = activation(g, plan.gelu) * u;
                        }
                        if comptime![plan.has_bias] {
                            y += f32::cast_from(bias[col]);
                        }
                        let idx = row * n_total + col;
                        if comptime![plan.has_residual] {
                            y += f32::cast_from(residual[idx]);
                        }
                        out[idx] = F::cast_from(y);
                    }
                }
            }
            sync_plane();
        }
    }
}

/// The tile a launch uses: `forced` (tests), else [`TUNE_ENV`] where it fits this problem and
/// device, else [`CmmaTile::auto`].
fn pick_tile<R: Runtime>(client: &ComputeClient<R>, p: &Problem<'_, R>) -> CmmaTile {
    let gated = p.gated.is_some();
    let smem = client.properties().hardware.max_shared_memory_size;
    let elem = p.x.dtype().size();
    if let Some(t) = CmmaTile::from_env() {
        if t.is_valid(gated) && t.shared_bytes(elem, gated) <= smem {
            return t;
        }
    }
    CmmaTile::auto(p.m, p.n, p.k, gated, caps::num_sms(client) as usize)
}

pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    bias: &DeviceTensor<R>,
    residual: &DeviceTensor<R>,
    forced: Option<CmmaTile>,
) -> Result<()> {
    let gated = p.gated.is_some();
    let dtype = p.x.dtype();
    let tile = forced.unwrap_or_else(|| pick_tile(client, p));
    let smem = client.properties().hardware.max_shared_memory_size;
    if !tile.is_valid(gated) || tile.shared_bytes(dtype.size(), gated) > smem {
        return Err(OpsError::invalid(
            op,
            format!(
                "tensor-core tile {tile:?} is not valid here (gated: {gated}; {} bytes of shared \
                 memory, {smem} available)",
                tile.shared_bytes(dtype.size(), gated)
            ),
        ));
    }
    let vector = caps::vector_size_for(client, dtype, p.k).min(tile.bk as usize);
    // cp.async moves 4, 8 or 16 bytes: 2-byte vectors (odd K) take the register path.
    let stages = if client.features().copy_async && vector * dtype.size() >= 4 {
        tile.stages
    } else {
        0
    };
    let plan = CmmaPlan {
        bm: tile.bm,
        bn: tile.bn,
        bk: tile.bk,
        warps_m: tile.warps_m,
        warps_n: tile.warps_n,
        stages,
        vector: vector as u32,
        group_m: GROUP_M,
        has_bias: p.bias.is_some(),
        has_residual: p.residual.is_some(),
        gated,
        gelu: p.gated == Some(Activation::Gelu),
    };
    let tiles_m = p.m.div_ceil(tile.bm as usize);
    let tiles_n = p.n.div_ceil(tile.out_cols(gated));
    unsafe {
        cmma_gemm_kernel::launch_unchecked::<R>(
            client,
            crate::launch::cube_count_1d(client, (tiles_m * tiles_n) as u32),
            CubeDim::new_1d(tile.units()),
            vector,
            p.x.as_buffer_arg(),
            p.w.as_buffer_arg(),
            p.w_up.as_buffer_arg(),
            bias.as_buffer_arg(),
            residual.as_buffer_arg(),
            p.out.as_buffer_arg(),
            p.m,
            p.n,
            p.k,
            p.up_row_offset,
            tiles_m,
            tiles_n,
            plan,
            dtype.elem_type(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tune_syntax() {
        assert_eq!(CmmaTile::parse("128,128,2,2,3"), Some(CmmaTile::LARGE));
        assert_eq!(
            CmmaTile::parse(" 128, 256 ,2,4,4,64"),
            Some(CmmaTile::new(128, 256, 2, 4, 4).with_bk(64))
        );
        assert_eq!(
            CmmaTile::parse("64,64,2,2,0"),
            Some(CmmaTile::new(64, 64, 2, 2, 0))
        );
        for bad in [
            "",
            "128,128,2,4",
            "128,128,2,4,1",
            "128,128,3,4,3",
            "100,128,2,4,3",
        ] {
            assert_eq!(CmmaTile::parse(bad), None, "{bad}");
        }
        assert_eq!(CmmaTile::parse("128,128,2,4,3,48"), None);
        assert_eq!(CmmaTile::parse("a,b,c,d,e"), None);
    }

    #[test]
    fn default_tiles() {
        let sms = 132;
        // 512x4096: 128 big tiles, ~1 per SM; K = 4096 -> the deep pipeline.
        assert_eq!(
            CmmaTile::auto(512, 4096, 4096, false, sms),
            CmmaTile::LARGE_DEEP
        );
        assert_eq!(
            CmmaTile::auto(4096, 4096, 4096, false, sms),
            CmmaTile::LARGE_DEEP
        );
        // qkv: 64 big tiles -> 64x64 (256 cubes); o/down: 48 -> 192 cubes.
        assert_eq!(CmmaTile::auto(512, 2048, 1536, false, sms), CmmaTile::SMALL);
        assert_eq!(CmmaTile::auto(512, 1536, 8960, false, sms), CmmaTile::SMALL);
        assert_eq!(
            CmmaTile::auto(512, 17920, 1536, false, sms),
            CmmaTile::LARGE
        );
        assert_eq!(
            CmmaTile::auto(512, 8960, 1536, true, sms),
            CmmaTile::LARGE_GATED
        );
        for t in [
            CmmaTile::LARGE,
            CmmaTile::LARGE_DEEP,
            CmmaTile::LARGE_GATED,
            CmmaTile::MEDIUM,
            CmmaTile::SMALL,
        ] {
            assert!(t.is_valid(false) && t.is_valid(true), "{t:?}");
            // Fits the 227 KB an H100 cube may opt into, with room for 2 cubes per SM.
            assert!(t.shared_bytes(2, true) <= 113 * 1024, "{t:?}");
        }
        assert!(!CmmaTile::new(64, 64, 2, 4, 3).is_valid(true));
    }
}
