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
//! tile) and an interleaved share of K. Lane `(g, t) = (lane / 4, lane % 4)` streams weight row
//! `col0 + g` of each tile; per K chunk of
//! `32 · kv` elements it loads `kv` 16-byte vectors of that row, vector `v` at `4v + t` (each load
//! instruction of the quad covers 64 contiguous bytes, the chunk `64 · kv`), and the same vectors
//! of x's rows `g` and `g + 8`.
//! The order of K inside a dot product is free as long as x and w agree, so each 8-element vector
//! is fed to two `mma`s as it sits in registers: for `mma` `j`, its elements `4j, 4j + 1` are the
//! lane's B values of logical k `2t, 2t + 1` and `4j + 2, 4j + 3` those of `2t + 8, 2t + 9`, and
//! the A values of the same logical k come from the same positions of the x vectors. No shuffles,
//! no shared memory in the loop, and 16-byte loads throughout.
//!
//! The `splits` planes of a column group then add their accumulators through shared memory in a
//! fixed order and the epilogue ([`crate::gemm::write_epilogue`]) writes each element once.
//! Rows of x beyond M are zeros. An `mma` computes each output element from its own row of A, so a
//! row's result does not depend on the other rows or on M: batched decode gives each sequence
//! exactly the logits it gets alone.
//!
//! The input norm multiplies x by the norm weight (in f32, rounded once to the dtype) before the
//! `mma`, sums x's squares in the same loop, and scales the reduced dot products by
//! `1 / rms(x)` in the epilogue. Only bf16 runs on this kernel by default ([`super::plan`]): an
//! f16 `x · g` can overflow where the normalised value would not.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;

use super::Problem;
use crate::caps;
use crate::gemm::{write_epilogue, EpilogueBlueprint};
use crate::norm::sum_squares;
use crate::{DType, OpsError, Result};

/// Elements per vector load (16 bytes of f16/bf16).
const VEC: usize = 8;
/// Output columns per plane (the `mma`'s N).
const COLS: usize = 8;
/// Rows of one `mma` tile.
const ROWS: usize = 16;
const PLANE: u32 = 32;
/// Planes per cube.
const PLANES: u32 = 8;

/// The launch shape: how many planes share a column group's K, and how many 16-byte vectors a
/// lane loads per chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorGemvShape {
    /// Planes per 8-column group, each over an interleaved share of K: 1, 2, 4, 8 or 16.
    pub splits: u32,
    /// 16-byte vectors of a weight row a lane loads per K chunk: 1, 2 or 4.
    pub vectors: u32,
    /// 8-column tiles per plane (1 or 2): with two, a lane streams two weight rows and each x
    /// load feeds both.
    pub tiles: u32,
}

impl TensorGemvShape {
    /// The shape that ran the 1.5B model's decode step fastest on an H200 (bf16, one and 16
    /// rows; `cubellm bench --family gemv-sweep` and per-kernel traces of the step). Each lane
    /// keeps two 16-byte weight loads in flight per chunk: the gated MLP's gate and up rows;
    /// for products with many columns (the LM head) two column tiles per plane; else two
    /// vectors of one row. K is split for about 64 planes per SM and at most 768 elements of K
    /// per plane: many short planes beat a few long ones (the LM head took 119 µs at 2 splits
    /// and 191 µs at one; `down` at two tiles per plane, 96 cubes of 16 planes, 15.3 µs in the
    /// step against 13.3 at one tile). The shape depends on N, K and the gate only, never on M,
    /// so that a row's result does not depend on how many rows run with it. At one row it is
    /// still slower than the CUDA-core GEMV on the DRAM-bound shapes (down 13.3 against 8.7 µs).
    pub fn auto(n: usize, k: usize, gated: bool, sms: usize) -> Self {
        let want = 64 * sms.max(1);
        let wide = !gated && n.div_ceil(COLS) >= want;
        let (vectors, tiles) = match (gated, wide) {
            (true, _) => (1u32, 1u32),
            (false, true) => (1, 2),
            (false, false) => (2, 1),
        };
        let chunks = k.div_ceil(VEC * 4 * vectors as usize).max(1);
        let groups = n.div_ceil(COLS * tiles as usize).max(1);
        let by_occupancy = want.div_ceil(groups).next_power_of_two();
        let by_length = k.div_ceil(768).next_power_of_two();
        let mut splits = by_occupancy.max(by_length).clamp(1, 16);
        while splits > 1 && splits > chunks {
            splits /= 2;
        }
        Self {
            splits: splits as u32,
            vectors,
            tiles,
        }
    }

    fn is_valid(&self) -> bool {
        matches!(self.splits, 1 | 2 | 4 | 8 | 16)
            && matches!(self.vectors, 1 | 2 | 4)
            && matches!(self.tiles, 1 | 2)
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
    /// x goes through an RMSNorm first.
    pub norm: bool,
    pub epilogue: EpilogueBlueprint,
    /// Signal `griddepcontrol.launch_dependents` once the weights are read.
    pub trigger: bool,
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
    let col0 = (CUBE_POS * comptime![plan.groups as usize] + group) * width;

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
    let chunk = comptime![4 * kv];
    let chunks = k_vectors.div_ceil(chunk);
    for c in range_stepped(split, chunks, splits) {
        #[unroll]
        for v in 0..kv {
            let kvec = c * chunk + v * 4 + t;
            let in_k = kvec < k_vectors;
            let mut lo = x_vector::<F, N>(x, g, kvec, k_vectors, m);
            let mut hi = zero;
            if upper {
                hi = x_vector::<F, N>(x, g + 8, kvec, k_vectors, m);
            }
            if normed {
                sq_lo += sum_squares(lo);
                sq_hi += sum_squares(hi);
                let mut gv = zero;
                if in_k {
                    gv = norm_weight[kvec];
                }
                lo = scaled::<F, N>(lo, gv);
                hi = scaled::<F, N>(hi, gv);
            }
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
                #[unroll]
                for j in 0..2usize {
                    let a = a_operand::<F, N, NA>(lo, hi, j);
                    mma_into(&def, &a, &b_operand::<F, N, NB>(wv, j), &mut acc, i);
                    if gated {
                        mma_into(&def, &a, &b_operand::<F, N, NB>(uv, j), &mut acc_up, i);
                    }
                }
            }
        }
    }
    if comptime![plan.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }

    // Partial sums of every plane: [plane][row][col] (then the up block, then squares
    // [plane][row][t]). Lane (g, t) holds rows g and g + 8, columns 8i + 2t and 8i + 2t + 1.
    let block = comptime![ROWS * plan.width()];
    let up_off = comptime![plan.up_offset()];
    let sq_off = comptime![plan.sq_offset()];
    let mut red = Shared::<[f32]>::new_slice(comptime![plan.shared_len()]);
    let base = plane * block;
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

    // One unit per output element of the cube, splits (and quads, for the squares) summed in order.
    let per_group = m * width;
    let outputs = comptime![plan.groups as usize] * per_group;
    for e in range_stepped(UNIT_POS as usize, outputs, CUBE_DIM as usize) {
        let gl = e / per_group;
        let row = (e % per_group) / width;
        let cc = e % width;
        let col = (CUBE_POS * comptime![plan.groups as usize] + gl) * width + cc;
        if col < n_cols {
            let mut total = 0f32;
            let mut total_up = 0f32;
            #[unroll]
            for s in 0..splits {
                let at = (gl * splits + s) * block + row * width + cc;
                total += red[at];
                if gated {
                    total_up += red[up_off + at];
                }
            }
            if normed {
                let mut sq = 0f32;
                #[unroll]
                for s in 0..splits {
                    #[unroll]
                    for q in 0..4usize {
                        sq += red[sq_off + (gl * splits + s) * ROWS * 4 + row * 4 + q];
                    }
                }
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
    }
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
/// or [`TensorGemvShape::auto`]'s.
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    p: &Problem<'_, R>,
    shape: Option<TensorGemvShape>,
) -> Result<()> {
    let sms = caps::num_sms(client) as usize;
    let shape = shape.unwrap_or_else(|| TensorGemvShape::auto(p.n, p.k, p.gated.is_some(), sms));
    if !shape.is_valid() {
        return Err(OpsError::invalid(
            op,
            format!(
                "tensor-core GEMV shape {shape:?}: splits must be 1, 2, 4, 8 or 16, vectors \
                 1, 2 or 4, tiles 1 or 2"
            ),
        ));
    }
    let groups = (PLANES / shape.splits).max(1);
    let bp = TensorGemvBlueprint {
        m: p.m as u32,
        splits: shape.splits,
        groups,
        vectors: shape.vectors,
        tiles: shape.tiles,
        norm: p.norm.is_some(),
        epilogue: p.epilogue(),
        trigger: caps::has_launch_dependents(client),
    };
    let (norm_weight, eps) = match p.norm {
        Some(n) => (n.weight, n.eps),
        None => (p.x, 0.0),
    };
    let width = COLS * shape.tiles as usize;
    let cubes = p.n.div_ceil(width).div_ceil(groups as usize) as u32;
    launch_dense!(tensor_gemv_kernel::<R>(
        client,
        crate::launch::cube_count_1d(client, cubes),
        CubeDim::new_1d(PLANE * shape.splits * groups),
        p,
        [VEC],
        [
            // Bound to x when there is no norm (never read then).
            norm_weight.as_buffer_arg(),
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
