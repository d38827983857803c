//! Moving operand tiles from global to shared memory: the zero-filling `cp.async` copy of one
//! vector, the cube-wide copy of a row-major tile step (asynchronous, or through registers), and
//! the transposed scalar tile load of the portable tiled GEMM.
//!
//! A [`TileCopy`] describes one K step of a `rows x row_vectors` tile of vectors, cut from
//! row-major matrices of `k_vecs` vectors per row, spread over the cube's units the same way in
//! every function here: slot `unit + i * units` (for `i` in `0..per_unit()`) is vector
//! `slot % row_vectors` of tile row `slot / row_vectors`; in shared memory the rows are `pitch`
//! vectors apart (padding keeps fragment loads off the same banks). Tile row `r` is row
//! `row0 + r` of the first source, or, in a stacked tile, the rows from `stacked` on come from a
//! second source (see [`tile_row()`]): a gated MLP's B tile holds gate rows, then the matching up
//! rows.

use cubecl::prelude::barrier::copy_async_checked;
use cubecl::prelude::*;

/// The comptime shape of one tile step (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileCopy {
    /// Rows of the tile.
    pub rows: usize,
    /// Vectors of one K step per row.
    pub row_vectors: usize,
    /// Vectors between the starts of two rows in shared memory (`>= row_vectors`).
    pub pitch: usize,
    /// Units of the cube that share the copy.
    pub units: usize,
    /// `Some(h)`: tile rows `h ..` come from the second source (see [`tile_row()`]).
    pub stacked: Option<usize>,
}

impl TileCopy {
    /// Vectors of the whole step.
    pub fn total(&self) -> usize {
        self.rows * self.row_vectors
    }

    /// Slots per unit (the last round may leave some units idle).
    pub fn per_unit(&self) -> usize {
        self.total().div_ceil(self.units)
    }

    /// Vectors of shared memory one buffer of the tile takes.
    pub fn stage_len(&self) -> usize {
        self.rows * self.pitch
    }
}

/// Starts the `cp.async` copy of `src[index]` into `dst[dst_index]` (one element of `C`, which
/// must be 4, 8 or 16 bytes: `elems` scalars), or, where `ok` is false, zero-fills
/// `dst[dst_index]` instead: the copy's source size is 0 and its address is clamped to the start
/// of `src`, so nothing outside the operand is read. Commit it to a barrier (see
/// [`crate::gemm::pipeline`]) before reading `dst`.
#[cube]
pub fn copy_or_zero_async<C: CubePrimitive>(
    src: &[C],
    index: usize,
    ok: bool,
    dst: &mut [C],
    dst_index: usize,
    #[comptime] elems: u32,
) {
    let start = select(ok, index, 0usize);
    let len = select(ok, 1usize, 0usize);
    copy_async_checked(
        &src[start..start + len],
        &mut dst[dst_index..dst_index + 1],
        elems,
    );
}

/// Where tile row `r` lives: `(vector offset of its start in its source, whether the row
/// exists, whether it is in the second source)`. Unstacked: row `row0 + r` of the first source,
/// which has `rows_total` rows of `k_vecs` vectors. Stacked at `h`: rows `r < h` as unstacked;
/// the others are row `second_offset + row0 + r - h` of the second source, existing when
/// `row0 + r - h < rows_total`.
#[cube]
pub fn tile_row(
    r: usize,
    row0: usize,
    rows_total: usize,
    second_offset: usize,
    k_vecs: usize,
    #[comptime] stacked: Option<usize>,
) -> (usize, bool, bool) {
    if comptime![stacked.is_some()] {
        let half = comptime![stacked.unwrap()];
        let mut row = row0 + r;
        let mut second = false;
        let mut offset = 0usize;
        if r >= half {
            row = row0 + r - half;
            second = true;
            offset = second_offset;
        }
        ((offset + row) * k_vecs, row < rows_total, second)
    } else {
        ((row0 + r) * k_vecs, row0 + r < rows_total, false)
    }
}

/// Starts this unit's `cp.async` copies of one K step of a tile (rows as [`tile_row()`] maps
/// them, vectors `k0v ..` of each) into `dst[base ..]`; what lies outside the matrices is
/// zero-filled (see [`copy_or_zero_async()`]). `second` is only read by a stacked tile.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn issue_tile_async<C: CubePrimitive>(
    first: &[C],
    second: &[C],
    dst: &mut [C],
    base: usize,
    row0: usize,
    rows_total: usize,
    second_offset: usize,
    k0v: usize,
    k_vecs: usize,
    #[comptime] tile: TileCopy,
    #[comptime] elems: u32,
) {
    let per_row = comptime![tile.row_vectors];
    let pitch = comptime![tile.pitch];
    let units = comptime![tile.units];
    let total = comptime![tile.total()];
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..tile.per_unit() {
        let idx = unit + i * units;
        if idx < total {
            let r = idx / per_row;
            let kv = k0v + idx % per_row;
            let (start, exists, in_second) =
                tile_row(r, row0, rows_total, second_offset, k_vecs, tile.stacked);
            let ok = exists && kv < k_vecs;
            let at = base + r * pitch + idx % per_row;
            if comptime![tile.stacked.is_some()] {
                if in_second {
                    copy_or_zero_async(second, start + kv, ok, dst, at, elems);
                } else {
                    copy_or_zero_async(first, start + kv, ok, dst, at, elems);
                }
            } else {
                copy_or_zero_async(first, start + kv, ok, dst, at, elems);
            }
        }
    }
}

/// Loads this unit's share of one K step of a tile (as [`issue_tile_async()`]) into
/// `regs[reg0 ..]`, zero outside the matrices.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn load_tile_regs<F: Float, N: Size>(
    first: &[Vector<F, N>],
    second: &[Vector<F, N>],
    regs: &mut Array<Vector<F, N>>,
    row0: usize,
    rows_total: usize,
    second_offset: usize,
    k0v: usize,
    k_vecs: usize,
    #[comptime] reg0: usize,
    #[comptime] tile: TileCopy,
) {
    let per_row = comptime![tile.row_vectors];
    let units = comptime![tile.units];
    let total = comptime![tile.total()];
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..tile.per_unit() {
        let idx = unit + i * units;
        let r = idx / per_row;
        let kv = k0v + idx % per_row;
        let (start, exists, in_second) =
            tile_row(r, row0, rows_total, second_offset, k_vecs, tile.stacked);
        let mut v = Vector::<F, N>::new(F::new(0.0));
        if idx < total && exists && kv < k_vecs {
            if comptime![tile.stacked.is_some()] {
                if in_second {
                    v = second[start + kv];
                } else {
                    v = first[start + kv];
                }
            } else {
                v = first[start + kv];
            }
        }
        regs[reg0 + i] = v;
    }
}

/// Writes `regs[reg0 ..]` (this unit's slots of a tile step, from [`load_tile_regs()`] or an
/// equivalent loader) into the padded shared rows at `dst[base ..]`.
#[cube]
pub fn store_tile_regs<C: CubePrimitive>(
    regs: &Array<C>,
    dst: &mut [C],
    base: usize,
    #[comptime] reg0: usize,
    #[comptime] tile: TileCopy,
) {
    let per_row = comptime![tile.row_vectors];
    let pitch = comptime![tile.pitch];
    let units = comptime![tile.units];
    let total = comptime![tile.total()];
    let unit = UNIT_POS as usize;
    #[unroll]
    for i in 0..tile.per_unit() {
        let idx = unit + i * units;
        if idx < total {
            dst[base + (idx / per_row) * pitch + idx % per_row] = regs[reg0 + i];
        }
    }
}

/// Loads a `rows x bk` tile of a row-major `[rows_total, k]` matrix of scalars into shared
/// memory transposed to `[bk][rows]` (so that a micro-tile reads both operands with unit
/// stride), zero outside the matrix; `units` units of the cube share it.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn load_tile_transposed<F: Float>(
    src: &[F],
    dst: &mut [F],
    row0: usize,
    k0: usize,
    rows_total: usize,
    k: usize,
    #[comptime] rows: u32,
    #[comptime] bk: u32,
    #[comptime] units: u32,
) {
    let count = comptime![(rows * bk).div_ceil(units)];
    #[unroll]
    for i in 0..count {
        let idx = UNIT_POS as usize + i as usize * units as usize;
        if idx < comptime![(rows * bk) as usize] {
            let r = idx / bk as usize;
            let c = idx % bk as usize;
            let gr = row0 + r;
            let gc = k0 + c;
            let mut v = F::new(0.0);
            if gr < rows_total && gc < k {
                v = src[gr * k + gc];
            }
            dst[c * rows as usize + r] = v;
        }
    }
}
