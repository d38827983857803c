//! The FlashAttention-2 step shared by the two tensor-core kernels (`flash.rs` for prefill,
//! `split_kv_mma.rs` for decode), CUDA only (inline `mma.sync`, `ldmatrix`, `cp.async`,
//! `ex2.approx`).
//!
//! A plane owns 16 query rows and a K/V tile slice of `keys` keys in shared memory; per tile it
//! runs [`flash_step`]: S = Q·Kᵀ on tensor cores, the online-softmax update with the
//! scale and log2(e) folded into one FFMA per score in front of `ex2` ([`online_softmax`]), then
//! O += P·V ([`accumulate_pv`]) with P taken from the accumulator registers as the next `mma`'s A
//! operand (two n8 accumulator chunks are one k16 A chunk), so the scores never touch shared
//! memory. Lane `lane` holds rows `g = lane / 4` and `g + 8` of the plane's 16 ([`LaneRows`]),
//! columns `8j + 2t + {0, 1}` with `t = lane % 4`; the 4 lanes of a quad share a row.
//!
//! The K/V tiles are double-buffered with `cp.async` ([`first_kv_tile`], [`next_kv_tile`]): the
//! copy of tile `kt + 1` is in flight while tile `kt` is computed.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::barrier::{copy_async, Barrier};
use cubecl::prelude::*;

use crate::online_softmax::EMPTY_MAX;

/// The comptime shape of one step of one plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct StepShape {
    /// Head dimension (a multiple of 16).
    pub d: usize,
    /// Keys of the tile this plane takes (a multiple of 16).
    pub keys: usize,
    /// Shared-memory row stride in elements.
    pub stride: usize,
}

impl StepShape {
    /// k16 chunks of the head dimension (S = Q·Kᵀ reduces over them).
    pub fn dk(&self) -> usize {
        self.d / 16
    }

    /// n8 chunks of the plane's keys (columns of S).
    pub fn nk(&self) -> usize {
        self.keys / 8
    }

    /// n8 chunks of the head dimension (columns of O).
    pub fn dn(&self) -> usize {
        self.d / 8
    }

    /// k16 chunks of the plane's keys (O += P·V reduces over them).
    pub fn kk(&self) -> usize {
        self.keys / 16
    }
}

/// The lane's share of the plane's 16 rows: columns `8j + 2t + {0, 1}` (`t` = lane % 4) of rows g
/// and g + 8, where those rows stop seeing keys (`lim0`, `lim1`), and their running softmax state:
/// maxima in raw score units, sums of `2^(score * c - max * c)` over the lane's columns (summed
/// over the quad at the end).
#[derive(CubeType)]
pub(crate) struct LaneRows {
    pub t: u32,
    pub lim0: u32,
    pub lim1: u32,
    pub m0: f32,
    pub m1: f32,
    pub l0: f32,
    pub l1: f32,
}

/// Where this lane points `ldmatrix` at: its row and column in the A operand (Q), in a K tile
/// (keys x dims) and in a V tile (keys x dims, loaded transposed).
#[derive(CubeType)]
pub(crate) struct LaneAddresses {
    pub q_row: usize,
    pub q_col: usize,
    pub k_row: usize,
    pub k_col: usize,
    pub v_row: usize,
    pub v_col: usize,
}

/// The `ldmatrix` addresses of lane `lane` (0..32).
#[cube]
pub(crate) fn lane_addresses(lane: u32) -> LaneAddresses {
    let mk = (lane / 8) as usize;
    LaneAddresses {
        q_row: (lane % 8 + 8 * ((lane / 8) % 2)) as usize,
        q_col: (8 * (lane / 16)) as usize,
        k_row: 8 * (mk / 2) + (lane % 8) as usize,
        k_col: 8 * (mk % 2),
        v_row: 8 * (mk % 2) + (lane % 8) as usize,
        v_col: 8 * (mk / 2),
    }
}

/// `2^x` with the hardware approximation (`ex2.approx.ftz.f32`: one MUFU instruction, relative
/// error about 2^-22, -huge gives +0). PTX: only the tensor-core kernels use it, and they only run
/// on CUDA.
#[cube]
pub(crate) fn exp2_approx(x: f32) -> f32 {
    let out: f32;
    gpu_asm!(
        "ex2.approx.ftz.f32 {o}, {i};",
        o = out(_) out,
        i = in(_) x,
        options(pure, nomem),
    );
    out
}

/// The maximum of `x` over the 4 lanes of a quad (one row of the accumulator layout).
#[cube]
pub(crate) fn quad_max(x: f32) -> f32 {
    let m = max(x, plane_shuffle_xor(x, 1u32));
    max(m, plane_shuffle_xor(m, 2u32))
}

/// The sum of `x` over the 4 lanes of a quad.
#[cube]
pub(crate) fn quad_sum(x: f32) -> f32 {
    let s = x + plane_shuffle_xor(x, 1u32);
    s + plane_shuffle_xor(s, 2u32)
}

/// Queues `cp.async` copies of `rows` rows of `d` elements (16 bytes per copy) from `src`
/// (row `r` at `src_base + min(r, last) * src_stride`) into `dst` (row `r` at
/// `dst_base + r * dst_stride`). Rows past `last` repeat row `last`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_rows_async<F: Float>(
    src: &[F],
    dst: &mut [F],
    src_base: usize,
    src_stride: usize,
    last: usize,
    dst_base: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] dst_stride: usize,
) {
    copy_rows_async_within::<F>(
        src,
        dst,
        src_base,
        src_stride,
        last,
        dst_base,
        0usize,
        comptime![rows],
        rows,
        d,
        dst_stride,
    );
}

/// [`copy_rows_async`] for the rows whose source row `min(r, last)` lies in `lo..hi` only.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_rows_async_within<F: Float>(
    src: &[F],
    dst: &mut [F],
    src_base: usize,
    src_stride: usize,
    last: usize,
    dst_base: usize,
    lo: usize,
    hi: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] dst_stride: usize,
) {
    let per_row = comptime![d / 8];
    for e in range_stepped(
        UNIT_POS as usize,
        comptime![rows * d / 8],
        CUBE_DIM as usize,
    ) {
        let r = e / per_row;
        let c = (e % per_row) * 8;
        let sr = min(r, last);
        if sr >= lo && sr < hi {
            let s = src_base + sr * src_stride + c;
            let t = dst_base + r * dst_stride + c;
            copy_async(&src[s..s + 8], &mut dst[t..t + 8], 8u32);
        }
    }
}

/// Queues, without waiting, the copies of the first K/V tile that [`first_kv_tile`] makes for
/// the rows whose key is below `split` (`settled`) or at or past it (`!settled`): the decode
/// kernel queues the keys no kernel in flight writes before its `griddepcontrol.wait` and the
/// newest ones after it, then commits both to `bar0` and waits there.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn queue_kv_tile_part<F: Float>(
    k: &[F],
    v: &[F],
    k_sh: &mut [F],
    v_sh: &mut [F],
    tile0: usize,
    kv_base: usize,
    kv_stride: usize,
    last_key: usize,
    split: usize,
    #[comptime] settled: bool,
    #[comptime] bk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let src = kv_base + tile0 * kv_stride;
    let last = last_key - tile0;
    let fresh = min(split.saturating_sub(tile0), bk);
    let mut lo = 0usize;
    let mut hi = fresh;
    if !comptime![settled] {
        lo = fresh;
        hi = comptime![bk];
    }
    // Source rows `min(r, last)` reach `lo..hi` only when both hold: otherwise every unit would
    // walk the tile's copies and queue none.
    if last >= lo && lo < hi {
        copy_rows_async_within::<F>(k, k_sh, src, kv_stride, last, 0usize, lo, hi, bk, d, stride);
        copy_rows_async_within::<F>(v, v_sh, src, kv_stride, last, 0usize, lo, hi, bk, d, stride);
    }
}

/// Queues the copies of the first K/V tile (keys from `tile0`; rows past `last_key` repeat row
/// `last_key`) into buffer 0 when there is one (`n_tiles > 0`), then waits on `bar0` for them and
/// for any copy queued before (the Q rows).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn first_kv_tile<F: Float>(
    k: &[F],
    v: &[F],
    k_sh: &mut [F],
    v_sh: &mut [F],
    bar0: &Shared<Barrier>,
    n_tiles: u32,
    tile0: usize,
    kv_base: usize,
    kv_stride: usize,
    last_key: usize,
    #[comptime] bk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    if n_tiles > 0 {
        let src = kv_base + tile0 * kv_stride;
        let last = last_key - tile0;
        copy_rows_async::<F>(k, k_sh, src, kv_stride, last, 0usize, bk, d, stride);
        copy_rows_async::<F>(v, v_sh, src, kv_stride, last, 0usize, bk, d, stride);
    }
    bar0.commit_copy_async();
    bar0.arrive_and_wait();
}

/// The pipeline at the top of iteration `kt`: queues the copies of tile `kt + 1` (keys from
/// `tile0 + (kt + 1) * bk`) into the other buffer, then waits for tile `kt` (tile 0 was waited for
/// by [`first_kv_tile`]). Returns the buffer tile `kt` is in (0 or 1).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn next_kv_tile<F: Float>(
    k: &[F],
    v: &[F],
    k_sh: &mut [F],
    v_sh: &mut [F],
    bar0: &Shared<Barrier>,
    bar1: &Shared<Barrier>,
    kt: u32,
    n_tiles: u32,
    tile0: usize,
    kv_base: usize,
    kv_stride: usize,
    last_key: usize,
    #[comptime] bk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) -> usize {
    let buf = (kt % 2) as usize;
    if kt + 1 < n_tiles {
        let nb = comptime![bk * stride] * (1 - buf);
        let first = tile0 + ((kt + 1) * bk as u32) as usize;
        let src = kv_base + first * kv_stride;
        let last = last_key - first;
        copy_rows_async::<F>(k, k_sh, src, kv_stride, last, nb, bk, d, stride);
        copy_rows_async::<F>(v, v_sh, src, kv_stride, last, nb, bk, d, stride);
        if buf == 0 {
            bar1.commit_copy_async();
        } else {
            bar0.commit_copy_async();
        }
    }
    if kt > 0 {
        if buf == 0 {
            bar0.arrive_and_wait();
        } else {
            bar1.arrive_and_wait();
        }
    }
    buf
}

/// The Q fragments (A operand) of the plane's 16 rows, starting at element `row_start` of `q_sh`
/// (the lane's own row, `q_row` included): they stay in registers for the whole key loop.
#[cube]
pub(crate) fn load_q_fragments<F: Float, NA: Size>(
    def: &MmaDefinition<F, F, f32>,
    q_sh: &[F],
    row_start: usize,
    lanes: &LaneAddresses,
    #[comptime] shape: StepShape,
) -> Array<Vector<F, NA>> {
    let mut q_frag = Array::<Vector<F, NA>>::new(comptime![shape.dk() * 4]);
    #[unroll]
    for c in 0..shape.dk() {
        let start = row_start + c * 16 + lanes.q_col;
        let regs = def.load_matrix::<F, NA>(&q_sh[start..start + 8], MatrixIdent::A, 4usize, false);
        #[unroll]
        for r in 0..4usize {
            q_frag[c * 4 + r] = regs[r];
        }
    }
    q_frag
}

/// Two m16n8k16 `mma`s of the A fragment `a` against the two n8 halves of an `ldmatrix.x4` B load
/// (`regs`), accumulating into the n8 chunks `n0` and `n0 + 1` of `c` (two vectors each: rows g
/// and g + 8).
#[cube]
fn mma_x2<F: Float, NA: Size, NB: Size, NC: Size>(
    def: &MmaDefinition<F, F, f32>,
    a: &Array<Vector<F, NA>>,
    regs: &Array<Vector<F, NB>>,
    c: &mut Array<Vector<f32, NC>>,
    n0: usize,
) {
    #[unroll]
    for half in 0..2usize {
        let mut bb = Array::<Vector<F, NB>>::new(2usize);
        bb[0] = regs[half * 2];
        bb[1] = regs[half * 2 + 1];
        let n = n0 + half;
        let mut acc = Array::<Vector<f32, NC>>::new(2usize);
        acc[0] = c[n * 2];
        acc[1] = c[n * 2 + 1];
        def.execute_inplace(a, &bb, &mut acc);
        c[n * 2] = acc[0];
        c[n * 2 + 1] = acc[1];
    }
}

/// The output accumulators of the plane's 16 rows (`d / 8` n8 chunks, two vectors each), zeroed.
#[cube]
pub(crate) fn zeroed_output<NC: Size>(#[comptime] shape: StepShape) -> Array<Vector<f32, NC>> {
    let mut o_acc = Array::<Vector<f32, NC>>::new(comptime![shape.dn() * 2]);
    #[unroll]
    for n in 0..comptime![shape.dn() * 2] {
        o_acc[n] = Vector::new(0f32);
    }
    o_acc
}

/// The lane's rows before they have seen any key.
#[cube]
pub(crate) fn lane_rows(t: u32, lim0: u32, lim1: u32) -> LaneRows {
    LaneRows {
        t,
        lim0,
        lim1,
        m0: f32::new(EMPTY_MAX),
        m1: f32::new(EMPTY_MAX),
        l0: 0f32,
        l1: 0f32,
    }
}

/// Scale, mask, online softmax: with `masked`, the score of key `key0 + 8j + 2t + e` becomes
/// `empty` unless it is below its row's limit; then the row maxima and sums in `rows` are
/// updated, `o_acc` rescaled, and `s_acc` replaced by P = `2^(score * c - max * c)` (`c` = scale *
/// log2(e)).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn online_softmax<NC: Size>(
    s_acc: &mut Array<Vector<f32, NC>>,
    o_acc: &mut Array<Vector<f32, NC>>,
    rows: &mut LaneRows,
    masked: bool,
    key0: u32,
    c: f32,
    #[comptime] shape: StepShape,
) {
    let empty = f32::new(EMPTY_MAX);
    let mut mx0 = empty;
    let mut mx1 = empty;
    #[unroll]
    for j in 0..shape.nk() {
        let mut v0 = s_acc[j * 2];
        let mut v1 = s_acc[j * 2 + 1];
        if masked {
            let key = key0 + (j * 8) as u32 + 2 * rows.t;
            v0.insert(0usize, select(key < rows.lim0, v0.extract(0usize), empty));
            v0.insert(
                1usize,
                select(key + 1 < rows.lim0, v0.extract(1usize), empty),
            );
            v1.insert(0usize, select(key < rows.lim1, v1.extract(0usize), empty));
            v1.insert(
                1usize,
                select(key + 1 < rows.lim1, v1.extract(1usize), empty),
            );
            s_acc[j * 2] = v0;
            s_acc[j * 2 + 1] = v1;
        }
        mx0 = max(mx0, max(v0.extract(0usize), v0.extract(1usize)));
        mx1 = max(mx1, max(v1.extract(0usize), v1.extract(1usize)));
    }
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    // Maxima stay in raw score units (the scale is positive); the scale and log2(e) fold into
    // one FFMA per score in front of `ex2`. A row that has seen nothing yet uses 0, so its masked
    // scores (EMPTY_MAX * c) still give 2^(-huge) = 0.
    let mn0 = max(rows.m0, mx0);
    let mn1 = max(rows.m1, mx1);
    let mc0 = select(mn0 == empty, 0f32, mn0 * c);
    let mc1 = select(mn1 == empty, 0f32, mn1 * c);
    let alpha0 = exp2_approx(rows.m0 * c - mc0);
    let alpha1 = exp2_approx(rows.m1 * c - mc1);
    rows.m0 = mn0;
    rows.m1 = mn1;
    rows.l0 *= alpha0;
    rows.l1 *= alpha1;
    #[unroll]
    for n in 0..shape.dn() {
        o_acc[n * 2] *= Vector::new(alpha0);
        o_acc[n * 2 + 1] *= Vector::new(alpha1);
    }
    #[unroll]
    for j in 0..shape.nk() {
        let v0 = s_acc[j * 2];
        let v1 = s_acc[j * 2 + 1];
        let mut p0 = Vector::<f32, NC>::empty();
        let mut p1 = Vector::<f32, NC>::empty();
        #[unroll]
        for e in 0..2usize {
            let e0 = exp2_approx(fma(v0.extract(e), c, -mc0));
            let e1 = exp2_approx(fma(v1.extract(e), c, -mc1));
            rows.l0 += e0;
            rows.l1 += e1;
            p0.insert(e, e0);
            p1.insert(e, e1);
        }
        s_acc[j * 2] = p0;
        s_acc[j * 2 + 1] = p1;
    }
}

/// O += P·V over the plane's `keys` keys of the V tile at `kbuf`: the accumulator layout of two
/// n8 chunks of P is the A layout of one k16 chunk, so P goes from registers to the next `mma`
/// without shared memory.
#[cube]
pub(crate) fn accumulate_pv<F: Float, NA: Size, NB: Size, NC: Size>(
    def: &MmaDefinition<F, F, f32>,
    s_acc: &Array<Vector<f32, NC>>,
    v_sh: &[F],
    kbuf: usize,
    lanes: &LaneAddresses,
    o_acc: &mut Array<Vector<f32, NC>>,
    #[comptime] shape: StepShape,
) {
    let stride = comptime![shape.stride];
    #[unroll]
    for kk in 0..shape.kk() {
        let mut a = Array::<Vector<F, NA>>::new(4usize);
        a[0] = Vector::<F, NA>::cast_from(s_acc[kk * 4]);
        a[1] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 1]);
        a[2] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 2]);
        a[3] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 3]);
        #[unroll]
        for np in 0..comptime![shape.dn() / 2] {
            let start = kbuf + (kk * 16 + lanes.v_row) * stride + np * 16 + lanes.v_col;
            let regs =
                def.load_matrix::<F, NB>(&v_sh[start..start + 8], MatrixIdent::B, 4usize, true);
            mma_x2::<F, NA, NB, NC>(def, &a, &regs, o_acc, np * 2);
        }
    }
}

/// One FlashAttention-2 step of a plane over the tile slice at `kbuf` of `k_sh` / `v_sh` (its
/// `keys` keys): S = Q·Kᵀ on tensor cores into `s_acc`, then [`online_softmax`] and
/// [`accumulate_pv`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_step<F: Float, NA: Size, NB: Size, NC: Size>(
    def: &MmaDefinition<F, F, f32>,
    q_frag: &Array<Vector<F, NA>>,
    k_sh: &[F],
    v_sh: &[F],
    kbuf: usize,
    lanes: &LaneAddresses,
    s_acc: &mut Array<Vector<f32, NC>>,
    o_acc: &mut Array<Vector<f32, NC>>,
    rows: &mut LaneRows,
    masked: bool,
    key0: u32,
    c: f32,
    #[comptime] shape: StepShape,
) {
    // S = Q·Kᵀ (16 rows x `keys` keys).
    let stride = comptime![shape.stride];
    #[unroll]
    for j in 0..comptime![shape.nk() * 2] {
        s_acc[j] = Vector::new(0f32);
    }
    #[unroll]
    for cc in 0..shape.dk() {
        let mut a = Array::<Vector<F, NA>>::new(4usize);
        #[unroll]
        for r in 0..4usize {
            a[r] = q_frag[cc * 4 + r];
        }
        #[unroll]
        for jj in 0..comptime![shape.nk() / 2] {
            let start = kbuf + (jj * 16 + lanes.k_row) * stride + cc * 16 + lanes.k_col;
            let regs =
                def.load_matrix::<F, NB>(&k_sh[start..start + 8], MatrixIdent::B, 4usize, false);
            mma_x2::<F, NA, NB, NC>(def, &a, &regs, s_acc, jj * 2);
        }
    }
    online_softmax::<NC>(s_acc, o_acc, rows, masked, key0, c, shape);
    accumulate_pv::<F, NA, NB, NC>(def, &*s_acc, v_sh, kbuf, lanes, o_acc, shape);
}
