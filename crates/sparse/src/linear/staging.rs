//! What both kernels share: their launch argument ([`BsrArgs`]), the work item a cube takes,
//! reading a stage's block columns ahead of its data, mapping a stage's load slots to global and
//! shared memory, loading a stage into registers and storing it into shared memory, and writing
//! outputs (to `y` with the bias, or to a partial-sum slot).

use cubecl::prelude::*;

use super::Blueprint;

/// The buffers and sizes both kernels take: `x[M, K]` and the weight's block values as vectors
/// (`V`), its block columns, the work list (four i32 per item: block-row, first block, end block,
/// partial-sum slot or -1; see [`crate::bsr`]), the bias `[N]` (bound to a placeholder when
/// absent), the output `y[M, N]` (`F`), the f32 partial sums of the cut block-rows, and `M`, the
/// vectors of a row of `x` and `N`.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct BsrArgs<V: CubePrimitive, F: CubePrimitive> {
    pub x: Box<[V]>,
    pub values: Box<[V]>,
    pub col: Box<[i32]>,
    pub items: Box<[i32]>,
    pub bias: Box<[F]>,
    pub y: Box<[F]>,
    pub partial: Box<[f32]>,
    pub m: usize,
    pub k_vectors: usize,
    pub n: usize,
}

/// This cube's work item (`CUBE_POS_X`): `(block-row, first block, end block, slot)`, where
/// `slot` is the item's partial-sum slot when its block-row was cut along K, else -1.
#[cube]
pub(crate) fn work_item(items: &[i32]) -> (usize, usize, usize, i32) {
    let at = CUBE_POS_X as usize * 4;
    (
        items[at] as usize,
        items[at + 1] as usize,
        items[at + 2] as usize,
        items[at + 3],
    )
}

/// Reads the block columns of the stage starting at block `first` that this unit's `x` loads
/// will need (0 where it loads weights or past `end`). Issued one stage ahead of the loads that
/// use them, so that the column index and the data it points to are not two back-to-back
/// memory latencies.
#[cube]
pub(crate) fn load_cols(
    col: &[i32],
    cols: &mut Array<u32>,
    first: usize,
    end: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let x_tile = comptime![bp.tile_m * bp.bv()];
    let x_loads = comptime![bp.x_loads()];
    #[unroll]
    for i in 0..bp.loads_per_unit() {
        let idx = i * comptime![bp.units] + unit;
        let mut c = 0u32;
        if idx < x_loads {
            let blk = first + idx / x_tile;
            if blk < end {
                c = col[blk] as u32;
            }
        }
        cols[i] = c;
    }
}

/// Where a stage's load slot `idx` (`i * units + unit`) comes from and goes to: whether it is in
/// range (rows past `m` and blocks past `end` read as zero), its global vector index (into `x`
/// for the first `x_loads` slots, with block column `col`; into the weight values after), and
/// its vector index in the padded shared buffer `buf`. Slots past the stage's loads have
/// `ok = false`. The register and the `cp.async` staging both go through here.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_slot(
    idx: usize,
    col: u32,
    buf: usize,
    first: usize,
    end: usize,
    m0: usize,
    m: usize,
    k_vectors: usize,
    #[comptime] bp: Blueprint,
) -> (bool, bool, usize, usize) {
    let bv = comptime![bp.bv()];
    let x_tile = comptime![bp.tile_m * bp.bv()];
    let x_loads = comptime![bp.x_loads()];
    let w_block = comptime![bp.block * bp.bv()];
    let total = comptime![bp.total_loads()];
    let mut is_x = false;
    let mut ok = false;
    let mut src = 0usize;
    let mut dst = 0usize;
    if idx < x_loads {
        let rem = idx % x_tile;
        let r = rem / bv;
        is_x = true;
        ok = first + idx / x_tile < end && m0 + r < m;
        src = (m0 + r) * k_vectors + col as usize * bv + rem % bv;
        // (block, row) pairs are consecutive rows of the staged tile.
        dst = buf * comptime![bp.x_stage()] + (idx / bv) * comptime![bp.xsv()] + idx % bv;
    } else if idx < total {
        let j = idx - x_loads;
        ok = first + j / w_block < end;
        src = first * w_block + j;
        dst = buf * comptime![bp.w_stage()] + (j / bv) * comptime![bp.wsv()] + j % bv;
    }
    (is_x, ok, src, dst)
}

/// Loads the global vectors of the stage's blocks `[first, first + stage_blocks)` (clipped to
/// `end`) that this unit is responsible for into registers, with the block columns `cols` read
/// by [`load_cols`]; out-of-range rows and blocks read as zero.
#[cube]
pub(crate) fn load_stage<F: Float, N: Size>(
    io: &BsrArgs<Vector<F, N>, F>,
    cols: &Array<u32>,
    regs: &mut Array<Vector<F, N>>,
    first: usize,
    end: usize,
    m0: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..bp.loads_per_unit() {
        let idx = i * comptime![bp.units] + unit;
        let (is_x, ok, src, _dst) =
            stage_slot(idx, cols[i], 0, first, end, m0, io.m, io.k_vectors, bp);
        let mut v = Vector::<F, N>::from_int(0);
        if ok {
            if is_x {
                v = io.x[src];
            } else {
                v = io.values[src];
            }
        }
        regs[i] = v;
    }
}

/// Writes the registers of [`load_stage`] into shared buffer `buf` (padded rows).
#[cube]
pub(crate) fn store_stage<F: Float, N: Size>(
    regs: &Array<Vector<F, N>>,
    x_sh: &mut [Vector<F, N>],
    w_sh: &mut [Vector<F, N>],
    buf: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let total = comptime![bp.total_loads()];
    #[unroll]
    for i in 0..bp.loads_per_unit() {
        let idx = i * comptime![bp.units] + unit;
        // Only the destination is used: the source arguments are placeholders.
        let (is_x, _ok, _src, dst) = stage_slot(idx, 0, buf, 0, 0, 0, 0, 0, bp);
        if is_x {
            x_sh[dst] = regs[i];
        } else if idx < total {
            w_sh[dst] = regs[i];
        }
    }
}

/// Writes the f32 sum `v` of output row `row`, column `c` of the item's block-row `brow`: to `y`
/// with the bias when the block-row is whole (`slot < 0`), else to the item's partial-sum slot.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_output<F: Float, N: Size>(
    io: &mut BsrArgs<Vector<F, N>, F>,
    v: f32,
    brow: usize,
    slot: i32,
    row: usize,
    c: usize,
    #[comptime] bp: Blueprint,
) {
    let block = comptime![bp.block];
    if slot < 0 {
        let mut y = v;
        if comptime![bp.has_bias] {
            y += f32::cast_from(io.bias[brow * block + c]);
        }
        let at = row * io.n + brow * block + c;
        io.y[at] = F::cast_from(y);
    } else {
        let at = ((slot as usize) * io.m + row) * block + c;
        io.partial[at] = v;
    }
}

/// Sums the staged output tile over the k-groups and writes it ([`write_output`]).
#[cube]
pub(crate) fn write_tile<F: Float, N: Size>(
    out_sh: &[f32],
    io: &mut BsrArgs<Vector<F, N>, F>,
    brow: usize,
    slot: i32,
    m0: usize,
    #[comptime] bp: Blueprint,
) {
    let unit = UNIT_POS as usize;
    let block = comptime![bp.block];
    let os = comptime![bp.out_stride()];
    #[unroll]
    for i in 0..comptime![bp.tile_m * bp.block / bp.units] {
        let e = i * comptime![bp.units] + unit;
        let r = e / block;
        let c = e % block;
        if m0 + r < io.m {
            let mut v = 0f32;
            #[unroll]
            for g in 0..bp.k_groups {
                v += out_sh[(g * comptime![bp.tile_m] + r) * os + c];
            }
            write_output(io, v, brow, slot, m0 + r, c, bp);
        }
    }
}
