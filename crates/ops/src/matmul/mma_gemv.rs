//! Skinny products on tensor cores (CUDA sm_80+, f16/bf16, M <= 16): the same products as
//! [`super::gemv`] (`y = x̂·wᵀ` + bias + residual, the gated MLP, the fused input norm), with the
//! multiply-adds done by `mma.sync` m16n8k16 instead of one FMA per weight per row.
//!
//! Why: the CUDA-core GEMV spends `M` FMAs (and the conversions) on every weight element, so at
//! 16 rows it is bound by instruction issue, not by memory: on an H200 the 1.5B model's 16-row
//! decode step ran its GEMVs 7 to 11 times slower than at one row. One `mma` multiplies a 16x16
//! slice of x by 16 weights of 8 columns in a single instruction whatever the number of rows, so
//! the loop is a load, a few register moves and two `mma`s per 16-byte weight vector.
//!
//! Layout. A plane owns one or two tiles of 8 output columns (weight rows `col0 .. col0 + 8` per
//! tile) and one **slice** of K: `32 · vectors` elements. Lane `(g, t) = (lane / 4, lane % 4)`
//! streams weight row `col0 + g` of each tile: its `vectors` 16-byte loads of the slice, vector
//! `v` at `4v + t` (each load instruction of a quad covers 64 contiguous bytes), are all issued
//! before the first `mma`, so a plane pays one memory latency for its whole slice rather than one
//! per loop step (a plane that walked its share of K in a loop of dependent steps made the
//! DRAM-bound products of the 1.5B model 1.5x slower than the CUDA-core GEMV at one row).
//! The order of K inside a dot product is free as long as x and w agree, so each 8-element vector
//! is fed to two `mma`s as it sits in registers: for `mma` `j`, its elements `4j, 4j + 1` are the
//! lane's B values of logical k `2t, 2t + 1` and `4j + 2, 4j + 3` those of `2t + 8, 2t + 9`, and
//! the A values of the same logical k come from the same positions of the x vectors. No shuffles,
//! no shared memory in the loop, and 16-byte loads throughout.
//!
//! A cube holds `splits` planes of consecutive slices of one column group (or, for short K,
//! several groups). When K has more slices than a cube's planes cover, the rest of K goes to
//! `cube_splits` cubes per group ([`crate::gemm::split_k`]): each sums its planes through shared
//! memory and leaves its partial in a [`SplitScratch`], and the last cube of the group to finish
//! sums the partials in slot order and applies the epilogue. Without a scratch (the plain
//! `linear_into` entry points) the planes loop over the remaining slices instead.
//! Every sum runs in a fixed order and the epilogue ([`crate::gemm::write_epilogue`]) writes each
//! element once. Rows of x beyond M are zeros. An `mma` computes each output element from its own
//! row of A, so a row's result does not depend on the other rows or on M: batched decode gives
//! each sequence exactly the logits it gets alone.
//!
//! With programmatic dependent launch (CUDA sm_90+, [`caps::has_pdl`]) the kernel issues its
//! first slice's weight loads before `griddepcontrol.wait`: it is launched when the kernel before
//! it signals `launch_dependents` (the GEMVs do once their weights are read), so its weights
//! stream while that kernel reduces and writes, and only x and the outputs wait for it.
//!
//! The input norm multiplies x by the norm weight (in f32, rounded once to the dtype) before the
//! `mma`, sums x's squares in the same loop, and scales the reduced dot products by
//! `1 / rms(x)` in the epilogue. Only bf16 runs on this kernel by default ([`super::plan`]): an
//! f16 `x · g` can overflow where the normalised value would not.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;

use super::Problem;
use crate::caps;
use crate::gemm::{last_to_finish, write_epilogue, EpilogueBlueprint, SplitNeed, SplitScratch};
use crate::norm::sum_squares;
use crate::{DType, OpsError, Result};

#[cfg(test)]
mod cuda_source;

/// Elements per vector load (16 bytes of f16/bf16).
const VEC: usize = 8;
/// Output columns per plane (the `mma`'s N).
const COLS: usize = 8;
/// Rows of one `mma` tile.
const ROWS: usize = 16;
const PLANE: u32 = 32;
/// The most planes a cube holds.
const MAX_PLANES: u32 = 16;
/// The most cubes one column group's K is split over.
pub const MAX_CUBE_SPLITS: u32 = 64;
/// 16-byte weight loads a lane keeps in flight per slice in [`TensorGemvShape::auto`]'s shapes.
const LOADS_IN_FLIGHT: usize = 8;

/// The launch shape: how K is cut into slices and spread over planes and cubes, and how many
/// columns a plane covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorGemvShape {
    /// Planes per column group in a cube, each on its own slice of K: 1 to 16.
    pub splits: u32,
    /// 16-byte vectors of a weight row a lane loads per slice (a slice is `32 · vectors`
    /// elements of K): 1, 2, 4 or 8.
    pub vectors: u32,
    /// 8-column tiles per plane (1 or 2): with two, a lane streams two weight rows and each x
    /// load feeds both.
    pub tiles: u32,
    /// Cubes per column group, each on its own share of K, summed by the last to finish
    /// (1 to [`MAX_CUBE_SPLITS`]; above 1 the launch needs a [`SplitScratch`]).
    pub cube_splits: u32,
}

impl TensorGemvShape {
    /// The shape for an `n`-column product over `k` (gated or not) on `sms` SMs. Each lane keeps
    /// 8 weight loads in flight per slice: 8 vectors of one row, or 4 of two (the gated MLP's
    /// gate and up rows; two column tiles for products with many columns, the LM head). A cube
    /// covers up to 16 slices; a longer K is split across cubes (about 8 slices each) when
    /// `split_k` (a scratch is at hand), else its planes loop over the rest. The shape depends
    /// on N, K, the gate and the scratch only, never on M, so that a row's result does not
    /// depend on how many rows run with it.
    pub fn auto(n: usize, k: usize, gated: bool, sms: usize, split_k: bool) -> Self {
        let wide = !gated && n.div_ceil(COLS) >= 16 * sms.max(1);
        let tiles = if wide { 2 } else { 1 };
        let rows_per_lane = tiles * if gated { 2 } else { 1 };
        let vectors = LOADS_IN_FLIGHT / rows_per_lane;
        let slices = k.div_ceil(VEC * 4 * vectors).max(1);
        let max_planes = MAX_PLANES as usize;
        let (splits, cube_splits) = if slices <= max_planes {
            (slices, 1)
        } else if split_k {
            let cubes = slices.div_ceil(8).min(MAX_CUBE_SPLITS as usize);
            (slices.div_ceil(cubes).min(max_planes), cubes)
        } else {
            (max_planes, 1)
        };
        Self {
            splits: splits as u32,
            vectors: vectors as u32,
            tiles: tiles as u32,
            cube_splits: cube_splits as u32,
        }
    }

    fn is_valid(&self) -> bool {
        (1..=MAX_PLANES).contains(&self.splits)
            && matches!(self.vectors, 1 | 2 | 4 | 8)
            && matches!(self.tiles, 1 | 2)
            && (1..=MAX_CUBE_SPLITS).contains(&self.cube_splits)
    }

    /// What a launch of this shape for `n` columns needs of a [`SplitScratch`] (nothing without
    /// a split across cubes).
    pub fn split_need(&self, n: usize, gated: bool, norm: bool) -> SplitNeed {
        split_need(*self, n, gated, norm)
    }

    /// Column groups of an `n`-column product.
    fn groups(&self, n: usize) -> usize {
        n.div_ceil(COLS * self.tiles as usize)
    }

    /// Column groups per cube: one when K is split across cubes, else enough for about 8 planes.
    fn groups_per_cube(&self) -> u32 {
        if self.cube_splits > 1 {
            1
        } else {
            (8 / self.splits).max(1)
        }
    }
}

/// Comptime shape of a launch (the kernel's compile key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorGemvBlueprint {
    /// Rows of x (1..=16).
    pub m: u32,
    pub splits: u32,
    /// Column groups per cube.
    pub groups: u32,
    pub vectors: u32,
    pub tiles: u32,
    pub cube_splits: u32,
    /// x goes through an RMSNorm first.
    pub norm: bool,
    pub epilogue: EpilogueBlueprint,
    /// Signal `griddepcontrol.launch_dependents` once the weights are read.
    pub trigger: bool,
    /// Load the first slice's weights before `griddepcontrol.wait` (see [`caps::has_pdl`]).
    pub early_wait: bool,
}

impl TensorGemvBlueprint {
    fn planes(&self) -> usize {
        (self.splits * self.groups) as usize
    }

    /// Output columns of a plane.
    fn width(&self) -> usize {
        COLS * self.tiles as usize
    }

    /// Shared f32s: per plane a 16 x width block of partial sums (two when gated) and, with the
    /// norm, 16x4 partial sums of squares.
    fn shared_len(&self) -> usize {
        let squares = if self.norm { ROWS * 4 } else { 0 };
        self.sq_offset() + self.planes() * squares
    }

    /// Where the up blocks start in the shared buffer.
    fn up_offset(&self) -> usize {
        self.planes() * ROWS * self.width()
    }

    /// Where the squares start in the shared buffer.
    fn sq_offset(&self) -> usize {
        let blocks = if self.epilogue.is_gated() { 2 } else { 1 };
        blocks * self.up_offset()
    }

    /// f32s of one cube's slot in the split scratch (see [`slot_len`]).
    fn slot_len(&self) -> usize {
        slot_len(self.width(), self.epilogue.is_gated(), self.norm)
    }
}

/// f32s of one cube's slot in the split scratch: sums for 16 rows x `width` columns (then the up
/// sums, then one sum of squares per row). Sized for 16 rows whatever M is, so that the scratch a
/// product needs does not depend on M either.
fn slot_len(width: usize, gated: bool, norm: bool) -> usize {
    let blocks = if gated { 2 } else { 1 };
    blocks * ROWS * width + if norm { ROWS } else { 0 }
}

/// What a launch of `shape` for `n` columns needs of a [`SplitScratch`] (nothing without a split
/// across cubes).
fn split_need(shape: TensorGemvShape, n: usize, gated: bool, norm: bool) -> SplitNeed {
    if shape.cube_splits <= 1 {
        return SplitNeed::default();
    }
    let groups = shape.groups(n);
    SplitNeed {
        partials: groups
            * shape.cube_splits as usize
            * slot_len(COLS * shape.tiles as usize, gated, norm),
        counters: groups,
    }
}

/// The most a product over a `[n_rows, k]` weight (any M up to 16, any epilogue, gated or not,
/// with or without the input norm) needs of a [`SplitScratch`] on `sms` SMs.
pub fn scratch_need(n_rows: usize, k: usize, sms: usize) -> SplitNeed {
    let plain = TensorGemvShape::auto(n_rows, k, false, sms, true);
    let gated = TensorGemvShape::auto(n_rows / 2, k, true, sms, true);
    split_need(plain, n_rows, false, true).max(split_need(gated, n_rows / 2, true, true))
}

/// Whether the tensor-core GEMV runs `dtype` with this K here: `mma` m16n8k16 and 16-byte
/// vectors along K.
pub(super) fn supported<R: Runtime>(client: &ComputeClient<R>, dtype: DType, k: usize) -> bool {
    caps::has_mma_m16n8k16(client, dtype) && caps::vector_size_for(client, dtype, k) == VEC
}

/// Two elements of an 8-element vector as one `mma` register.
#[cube]
fn pair<F: Float, N: Size, P: Size>(v: Vector<F, N>, #[comptime] i: usize) -> Vector<F, P> {
    let mut r = Vector::<F, P>::empty();
    r.insert(0usize, v.extract(i));
    r.insert(1usize, v.extract(i + 1));
    r
}

/// The A operand of `mma` `j` of a vector: rows g (`lo`) and g + 8 (`hi`) at logical k
/// `2t, 2t + 1` (elements `4j, 4j + 1`) and `2t + 8, 2t + 9` (elements `4j + 2, 4j + 3`).
#[cube]
fn a_operand<F: Float, N: Size, P: Size>(
    lo: Vector<F, N>,
    hi: Vector<F, N>,
    #[comptime] j: usize,
) -> Array<Vector<F, P>> {
    let mut a = Array::<Vector<F, P>>::new(4usize);
    a[0] = pair::<F, N, P>(lo, 4 * j);
    a[1] = pair::<F, N, P>(hi, 4 * j);
    a[2] = pair::<F, N, P>(lo, 4 * j + 2);
    a[3] = pair::<F, N, P>(hi, 4 * j + 2);
    a
}

/// The B operand of `mma` `j` of a weight vector (see [`a_operand`]).
#[cube]
fn b_operand<F: Float, N: Size, P: Size>(
    w: Vector<F, N>,
    #[comptime] j: usize,
) -> Array<Vector<F, P>> {
    let mut b = Array::<Vector<F, P>>::new(2usize);
    b[0] = pair::<F, N, P>(w, 4 * j);
    b[1] = pair::<F, N, P>(w, 4 * j + 2);
    b
}

/// `x[row, kvec]`, or zeros outside the rows or K.
#[cube]
fn x_vector<F: Float, N: Size>(
    x: &[Vector<F, N>],
    row: usize,
    kvec: usize,
    k_vectors: usize,
    #[comptime] m: usize,
) -> Vector<F, N> {
    let mut v = Vector::<F, N>::new(F::new(0.0));
    if row < m && kvec < k_vectors {
        v = x[row * k_vectors + kvec];
    }
    v
}

/// `x · g` elementwise in f32, rounded once.
#[cube]
fn scaled<F: Float, N: Size>(x: Vector<F, N>, g: Vector<F, N>) -> Vector<F, N> {
    Vector::<F, N>::cast_from(Vector::<f32, N>::cast_from(x) * Vector::<f32, N>::cast_from(g))
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tensor_gemv_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<F, N>],
    w_up: &[Vector<F, N>],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    norm_weight: &[Vector<F, N>],
    partials: &mut [f32],
    counters: &[Atomic<u32>],
    n_cols: usize,
    k_vectors: usize,
    up_row_offset: usize,
    inv_k: f32,
    eps: f32,
    #[comptime] plan: TensorGemvBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let size!(NA) = def.vector_size(MatrixIdent::A);
    let size!(NB) = def.vector_size(MatrixIdent::B);
    let size!(NC) = def.vector_size(MatrixIdent::Accumulator);

    let m = comptime![plan.m as usize];
    let splits = comptime![plan.splits as usize];
    let cube_splits = comptime![plan.cube_splits as usize];
    let groups = comptime![plan.groups as usize];
    let kv = comptime![plan.vectors as usize];
    let tiles = comptime![plan.tiles as usize];
    let width = comptime![plan.width()];
    let gated = comptime![plan.epilogue.is_gated()];
    let normed = comptime![plan.norm];
    let upper = comptime![plan.m > 8];

    let lane = (UNIT_POS % PLANE) as usize;
    let plane = (UNIT_POS / PLANE) as usize;
    let g = lane / 4;
    let t = lane % 4;
    let split = plane % splits;
    let group = plane / splits;
    // Cubes of one column group are consecutive: `cube_splits` shares of its K.
    let share = CUBE_POS % cube_splits;
    let block = CUBE_POS / cube_splits;
    let col0 = (block * groups + group) * width;

    // Accumulators of tile i: [2i] rows g, [2i + 1] rows g + 8 (columns 2t, 2t + 1 of the tile).
    let mut acc = Array::<Vector<f32, NC>>::new(comptime![2 * tiles]);
    let mut acc_up = Array::<Vector<f32, NC>>::new(comptime![2 * tiles]);
    #[unroll]
    for i in 0..comptime![2 * tiles] {
        acc[i] = Vector::new(0f32);
        acc_up[i] = Vector::new(0f32);
    }
    let mut sq_lo = 0f32;
    let mut sq_hi = 0f32;

    let zero = Vector::<F, N>::new(F::new(0.0));
    let slice_vectors = comptime![4 * kv];
    let slices = k_vectors.div_ceil(slice_vectors);
    // One slice per plane and pass; the passes after the first only run for a K longer than
    // the planes of every cube of the group cover.
    for s in range_stepped(
        share * splits + split,
        slices,
        comptime![plan.splits as usize * plan.cube_splits as usize],
    ) {
        let first = s * slice_vectors + t;
        // Every weight load of the slice first, then the `mma`s.
        let mut wr = Array::<Vector<F, N>>::new(comptime![kv * tiles]);
        let mut ur = Array::<Vector<F, N>>::new(comptime![if gated { kv * tiles } else { 1 }]);
        #[unroll]
        for v in 0..kv {
            let kvec = first + 4 * v;
            let in_k = kvec < k_vectors;
            #[unroll]
            for i in 0..tiles {
                let w_col = col0 + i * COLS + g;
                let mut wv = zero;
                let mut uv = zero;
                if w_col < n_cols && in_k {
                    wv = w[w_col * k_vectors + kvec];
                    if gated {
                        uv = w_up[(up_row_offset + w_col) * k_vectors + kvec];
                    }
                }
                wr[v * tiles + i] = wv;
                if gated {
                    ur[v * tiles + i] = uv;
                }
            }
        }
        if comptime![plan.early_wait] {
            // Nothing before this depends on the kernel before this one (weights are never
            // written), so the loads above overlap its end; x and the outputs wait for it.
            gpu_asm!("griddepcontrol.wait;");
        }
        #[unroll]
        for v in 0..kv {
            let kvec = first + 4 * v;
            let mut lo = x_vector::<F, N>(x, g, kvec, k_vectors, m);
            let mut hi = zero;
            if upper {
                hi = x_vector::<F, N>(x, g + 8, kvec, k_vectors, m);
            }
            if normed {
                sq_lo += sum_squares(lo);
                sq_hi += sum_squares(hi);
                let mut gv = zero;
                if kvec < k_vectors {
                    gv = norm_weight[kvec];
                }
                lo = scaled::<F, N>(lo, gv);
                hi = scaled::<F, N>(hi, gv);
            }
            #[unroll]
            for j in 0..2usize {
                let a = a_operand::<F, N, NA>(lo, hi, j);
                #[unroll]
                for i in 0..tiles {
                    let b = b_operand::<F, N, NB>(wr[v * tiles + i], j);
                    mma_into(&def, &a, &b, &mut acc, i);
                    if gated {
                        let bu = b_operand::<F, N, NB>(ur[v * tiles + i], j);
                        mma_into(&def, &a, &bu, &mut acc_up, i);
                    }
                }
            }
        }
    }
    if comptime![plan.early_wait] {
        // w, w_up, bias and norm_weight: the parameters read before the wait (`crate::pdl`).
        gpu_asm!("// cubellm.early_params 1 2 3 6");
        // For planes that had no slice (and a no-op for the others).
        gpu_asm!("griddepcontrol.wait;");
    }
    if comptime![plan.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }

    // Partial sums of every plane: [plane][row][col] (then the up block, then squares
    // [plane][row][t]). Lane (g, t) holds rows g and g + 8, columns 8i + 2t and 8i + 2t + 1.
    let plane_block = comptime![ROWS * plan.width()];
    let up_off = comptime![plan.up_offset()];
    let sq_off = comptime![plan.sq_offset()];
    let mut red = Shared::<[f32]>::new_slice(comptime![plan.shared_len()]);
    let base = plane * plane_block;
    #[unroll]
    for i in 0..tiles {
        #[unroll]
        for h in 0..2usize {
            let row = g + 8 * h;
            #[unroll]
            for e in 0..2usize {
                let at = base + row * width + i * COLS + 2 * t + e;
                red[at] = acc[2 * i + h].extract(e);
                if gated {
                    red[up_off + at] = acc_up[2 * i + h].extract(e);
                }
            }
        }
    }
    if normed {
        red[sq_off + plane * ROWS * 4 + g * 4 + t] = sq_lo;
        red[sq_off + plane * ROWS * 4 + (g + 8) * 4 + t] = sq_hi;
    }
    sync_cube();

    // One unit per output element of the cube, the planes (and quads, for the squares) summed
    // in order.
    let per_group = m * width;
    if comptime![plan.cube_splits == 1] {
        for e in range_stepped(UNIT_POS as usize, groups * per_group, CUBE_DIM as usize) {
            let gl = e / per_group;
            let row = (e % per_group) / width;
            let col = (block * groups + gl) * width + e % width;
            if col < n_cols {
                let total = plane_sum(&red, gl * splits, e % per_group, 0usize, plan);
                let mut total_up = 0f32;
                if gated {
                    total_up = plane_sum(&red, gl * splits, e % per_group, up_off, plan);
                }
                let mut sq = 0f32;
                if normed {
                    sq = plane_squares(&red, gl * splits, row, plan);
                }
                write_normed::<F>(
                    out, total, total_up, sq, inv_k, eps, row, col, n_cols, bias, residual, plan,
                );
            }
        }
    } else {
        // One group per cube: leave this share's sums in its slot, and the last share of the
        // group to finish adds the slots in order.
        let slot_len = comptime![plan.slot_len()];
        let up_at = comptime![ROWS * plan.width()];
        let sq_at = comptime![(if plan.epilogue.is_gated() { 2 } else { 1 }) * ROWS * plan.width()];
        let mine = (block * cube_splits + share) * slot_len;
        for e in range_stepped(UNIT_POS as usize, per_group, CUBE_DIM as usize) {
            partials[mine + e] = plane_sum(&red, 0usize, e, 0usize, plan);
            if gated {
                partials[mine + up_at + e] = plane_sum(&red, 0usize, e, up_off, plan);
            }
        }
        if normed {
            for row in range_stepped(UNIT_POS as usize, m, CUBE_DIM as usize) {
                partials[mine + sq_at + row] = plane_squares(&red, 0, row, plan);
            }
        }
        if last_to_finish(counters, block, plan.cube_splits) {
            let first_slot = block * cube_splits * slot_len;
            for e in range_stepped(UNIT_POS as usize, per_group, CUBE_DIM as usize) {
                let row = e / width;
                let col = block * width + e % width;
                if col < n_cols {
                    let mut total = 0f32;
                    let mut total_up = 0f32;
                    let mut sq = 0f32;
                    for c in 0..cube_splits {
                        let slot = first_slot + c * slot_len;
                        total += partials[slot + e];
                        if gated {
                            total_up += partials[slot + up_at + e];
                        }
                        if normed {
                            sq += partials[slot + sq_at + row];
                        }
                    }
                    write_normed::<F>(
                        out, total, total_up, sq, inv_k, eps, row, col, n_cols, bias, residual,
                        plan,
                    );
                }
            }
        }
    }
}

/// Writes one output element: the product (and the gated up product) scaled by the input norm's
/// `1 / rms` from the summed squares `sq` when the plan has the norm, then the epilogue.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_normed<F: Float>(
    out: &mut [F],
    total: f32,
    total_up: f32,
    sq: f32,
    inv_k: f32,
    eps: f32,
    row: usize,
    col: usize,
    n_cols: usize,
    bias: &[F],
    residual: &[F],
    #[comptime] plan: TensorGemvBlueprint,
) {
    let mut total = total;
    let mut total_up = total_up;
    if comptime![plan.norm] {
        let inv_rms = f32::inverse_sqrt(sq * inv_k + eps);
        total *= inv_rms;
        total_up *= inv_rms;
    }
    write_epilogue::<F>(
        out,
        total,
        total_up,
        row,
        col,
        n_cols,
        bias,
        residual,
        plan.epilogue,
    );
}

/// Output element `e` (`row * width + col`) of a column group summed over its planes
/// `first_plane ..` in order, from the block at `offset` (0: the product, `up_offset`: the up
/// product).
#[cube]
fn plane_sum(
    red: &[f32],
    first_plane: usize,
    e: usize,
    #[comptime] offset: usize,
    #[comptime] plan: TensorGemvBlueprint,
) -> f32 {
    let plane_block = comptime![ROWS * plan.width()];
    let row = e / comptime![plan.width()];
    let col = e % comptime![plan.width()];
    let mut total = 0f32;
    #[unroll]
    for s in 0..comptime![plan.splits as usize] {
        total +=
            red[offset + (first_plane + s) * plane_block + row * comptime![plan.width()] + col];
    }
    total
}

/// The sum of squares of row `row` of x over a column group's planes `first_plane ..` and each
/// plane's quads, in order.
#[cube]
fn plane_squares(
    red: &[f32],
    first_plane: usize,
    row: usize,
    #[comptime] plan: TensorGemvBlueprint,
) -> f32 {
    let mut sq = 0f32;
    #[unroll]
    for s in 0..comptime![plan.splits as usize] {
        #[unroll]
        for q in 0..4usize {
            sq += red[comptime![plan.sq_offset()] + (first_plane + s) * ROWS * 4 + row * 4 + q];
        }
    }
    sq
}

/// One `mma` accumulating into tile `i` of `acc` (its two accumulator vectors).
#[cube]
fn mma_into<F: Float, NA: Size, NB: Size, NC: Size>(
    def: &MmaDefinition<F, F, f32>,
    a: &Array<Vector<F, NA>>,
    b: &Array<Vector<F, NB>>,
    acc: &mut Array<Vector<f32, NC>>,
    #[comptime] i: usize,
) {
    let mut c = Array::<Vector<f32, NC>>::new(2usize);
    c[0] = acc[2 * i];
    c[1] = acc[2 * i + 1];
    def.execute_inplace(a, b, &mut c);
    acc[2 * i] = c[0];
    acc[2 * i + 1] = c[1];
}

/// Launches the tensor-core GEMV on a validated problem (M <= 16, [`supported`]), with `shape`
/// or [`TensorGemvShape::auto`]'s. With `scratch`, K may be split across cubes.
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    shape: Option<TensorGemvShape>,
    scratch: Option<&SplitScratch<R>>,
) -> Result<()> {
    let sms = caps::num_sms(client) as usize;
    let (gated, norm) = (p.gated.is_some(), p.norm.is_some());
    let fits =
        |s: TensorGemvShape| scratch.is_some_and(|x| x.fits(split_need(s, p.n, gated, norm)));
    let shape = match shape {
        Some(s) => s,
        None => {
            // A scratch too small for the split keeps K in one cube.
            let s = TensorGemvShape::auto(p.n, p.k, gated, sms, scratch.is_some());
            if s.cube_splits > 1 && !fits(s) {
                TensorGemvShape::auto(p.n, p.k, gated, sms, false)
            } else {
                s
            }
        }
    };
    if !shape.is_valid() {
        return Err(OpsError::invalid(
            op,
            format!(
                "tensor-core GEMV shape {shape:?}: splits must be 1 to {MAX_PLANES}, vectors \
                 1, 2, 4 or 8, tiles 1 or 2, cube_splits 1 to {MAX_CUBE_SPLITS}"
            ),
        ));
    }
    let split = match scratch {
        _ if shape.cube_splits == 1 => None,
        Some(s) if fits(shape) => Some(s),
        _ => {
            return Err(OpsError::invalid(
                op,
                format!(
                    "a tensor-core GEMV shape with cube_splits = {} needs a split-K scratch of \
                     {:?} (given: {scratch:?})",
                    shape.cube_splits,
                    split_need(shape, p.n, gated, norm)
                ),
            ))
        }
    };
    let groups = shape.groups_per_cube();
    let bp = TensorGemvBlueprint {
        m: p.m as u32,
        splits: shape.splits,
        groups,
        vectors: shape.vectors,
        tiles: shape.tiles,
        cube_splits: shape.cube_splits,
        norm: p.norm.is_some(),
        epilogue: p.epilogue(),
        trigger: caps::has_launch_dependents(client),
        early_wait: caps::has_pdl(client),
    };
    let (norm_weight, eps) = match p.norm {
        Some(n) => (n.weight, n.eps),
        None => (p.x, 0.0),
    };
    // Without a split the scratch operands are bound to x (never read then).
    let (partials, counters) = match split {
        Some(s) => unsafe { (s.partials_arg(), s.counters_arg()) },
        None => unsafe { (p.x.as_buffer_arg(), p.x.as_buffer_arg()) },
    };
    let cubes = (shape.groups(p.n).div_ceil(groups as usize) * shape.cube_splits as usize) as u32;
    launch_dense!(tensor_gemv_kernel::<R>(
        client,
        crate::launch::cube_count_1d(client, cubes),
        CubeDim::new_1d(PLANE * shape.splits * groups),
        p,
        [VEC],
        [
            // Bound to x when there is no norm (never read then).
            norm_weight.as_buffer_arg(),
            partials,
            counters,
            p.n,
            p.k / VEC,
            p.up_row_offset,
            1.0 / p.k as f32,
            eps,
            bp,
            p.x.dtype().elem_type()
        ]
    ));
    Ok(())
}
