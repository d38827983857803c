//! What happens to an f32 accumulator on its way to the output: the fused activation of a gated
//! MLP, bias, residual, one rounding to the output dtype; the dequantizing form of the 8-bit
//! GEMMs (scales first); and the tensor-core writer that takes 16x16 fragments through shared
//! memory to global memory with that epilogue.
//!
//! Order of operations (the same in every kernel, and what an unfused sequence of ops would
//! compute up to the rounding of the sum): `y = acc`; gated: `y = act(round(gate)) * round(up)`
//! (both products rounded to the output dtype first, as two separate linears would deliver
//! them); `y += bias[col]`; `y += residual[row, col]`; `out = round(y)`. Bias and residual are
//! read in the output dtype and added in f32.

use cubecl::cmma;
use cubecl::prelude::*;

use crate::pdl::index_after;

/// The gate activation of a gated MLP (`act(x·gateᵀ) * (x·upᵀ)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    /// `x * sigmoid(x)` (Qwen2, Llama).
    #[default]
    Silu,
    /// PyTorch's default `F.gelu` (exact, erf).
    Gelu,
}

/// The comptime shape of an epilogue: which operands it reads and whether the accumulator is
/// the gate half of a gated MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct EpilogueBlueprint {
    /// Adds `bias[col]` (`[N]`, output dtype).
    pub has_bias: bool,
    /// Adds `residual[row * n + col]` (the output's shape and dtype).
    pub has_residual: bool,
    /// `Some(act)`: the accumulator is a gate product, and `act(gate) * up` replaces it.
    pub gate: Option<Activation>,
}

impl EpilogueBlueprint {
    /// Bias and residual as given, no gate.
    pub const fn linear(has_bias: bool, has_residual: bool) -> Self {
        Self {
            has_bias,
            has_residual,
            gate: None,
        }
    }

    /// The gated MLP's epilogue (`act(gate) * up`, no bias, no residual).
    pub const fn gated(act: Activation) -> Self {
        Self {
            has_bias: false,
            has_residual: false,
            gate: Some(act),
        }
    }

    /// Whether a second (up) accumulator takes part.
    pub fn is_gated(&self) -> bool {
        self.gate.is_some()
    }

    /// Whether the gate activation is GELU (else SiLU; meaningless when not gated).
    pub fn gelu(&self) -> bool {
        self.gate == Some(Activation::Gelu)
    }
}

/// The gate activations, in f32: SiLU, or GELU in PyTorch's default exact (erf) form.
#[cube]
pub fn activation(g: f32, #[comptime] gelu: bool) -> f32 {
    if comptime![gelu] {
        0.5f32 * g * (1f32 + Erf::erf(g * 0.707_106_77f32))
    } else {
        g / (1f32 + f32::exp(-g))
    }
}

/// The epilogue of one output element `(row, col)` of an `[.., n]` output: `acc` is the f32
/// accumulator (the gate product when gated), `up` the up product (read only when gated: pass
/// anything, e.g. `0f32`, otherwise). `bias` and `residual` are read only where the blueprint
/// asks for them (bind any buffer of the output dtype otherwise).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn epilogue_value<F: Float>(
    acc: f32,
    up: f32,
    row: usize,
    col: usize,
    n: usize,
    bias: &[F],
    residual: &[F],
    #[comptime] bp: EpilogueBlueprint,
) -> F {
    let b = bias_value::<F>(bias, col, bp);
    let r = residual_value::<F>(residual, row * n + col, bp);
    epilogue_loaded::<F>(acc, up, b, r, bp)
}

/// `bias[col]` in f32 where the blueprint adds a bias (else zero, never read).
///
/// Split from [`epilogue_value()`] so that a kernel can load it early: a bias is a weight, which
/// no kernel writes, so a decode GEMV loads it with its first weight vectors, before it waits
/// for the kernel before it, instead of after its reductions, where the load's whole latency
/// sat between the last product and the output's store.
#[cube]
pub fn bias_value<F: Float>(bias: &[F], col: usize, #[comptime] bp: EpilogueBlueprint) -> f32 {
    let mut b = 0f32;
    if comptime![bp.has_bias] {
        b = f32::cast_from(bias[col]);
    }
    b
}

/// `residual[at]` in f32 where the blueprint adds a residual (else zero, never read). A residual
/// is the output of an earlier kernel: under programmatic dependent launch it is read after the
/// wait, but it can still be read before the products (see [`bias_value()`]).
#[cube]
pub fn residual_value<F: Float>(
    residual: &[F],
    at: usize,
    #[comptime] bp: EpilogueBlueprint,
) -> f32 {
    let mut r = 0f32;
    if comptime![bp.has_residual] {
        r = f32::cast_from(residual[at]);
    }
    r
}

/// [`epilogue_value()`] with its bias and residual already loaded ([`bias_value()`],
/// [`residual_value()`]): the same operations in the same order, so the same result.
#[cube]
pub fn epilogue_loaded<F: Float>(
    acc: f32,
    up: f32,
    bias: f32,
    residual: f32,
    #[comptime] bp: EpilogueBlueprint,
) -> F {
    let mut y = acc;
    if comptime![bp.is_gated()] {
        // Gate and up rounded to the dtype first, as two separate linears would deliver them.
        let g = f32::cast_from(F::cast_from(y));
        let u = f32::cast_from(F::cast_from(up));
        y = activation(g, comptime![bp.gelu()]) * u;
    }
    if comptime![bp.has_bias] {
        y += bias;
    }
    if comptime![bp.has_residual] {
        y += residual;
    }
    F::cast_from(y)
}

/// [`epilogue_value()`] written to `out[row * n + col]` (no bounds check: the caller's).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn write_epilogue<F: Float>(
    out: &mut [F],
    acc: f32,
    up: f32,
    row: usize,
    col: usize,
    n: usize,
    bias: &[F],
    residual: &[F],
    #[comptime] bp: EpilogueBlueprint,
) {
    out[row * n + col] = epilogue_value::<F>(acc, up, row, col, n, bias, residual, bp);
}

/// The most rows of x for which the decode GEMVs (`crate::matmul::gemv` and the quant crate's SIMT
/// 8-bit GEMV) load their epilogue's operands ahead of the products ([`bias_value()`] with the
/// first weights, [`residuals_ahead()`] after the products) and reduce their sums in one pass
/// (`crate::reduce::row_sums_split_in`): registers held per row, so not for batches of 16.
pub const AHEAD_ROWS: u32 = 2;

/// The values a decode GEMV's epilogue reduces in one pass for `rows` rows of x and `cols`
/// columns a group: the products, the up products when `gated`, and x's squares behind the
/// input `norm`; one above [`AHEAD_ROWS`], where they reduce one value at a time.
pub fn ahead_sums(rows: u32, cols: u32, gated: bool, norm: bool) -> usize {
    if rows > AHEAD_ROWS {
        return 1;
    }
    let halves = if gated { 2 } else { 1 };
    (rows * cols * halves + if norm { rows } else { 0 }) as usize
}

/// The residual of each of `rows` rows of x and `cols` columns from `col0` into
/// `residual_f[m * cols + j]` (a column past `n` reads column `n - 1`'s, never written), once the
/// unit's partial dot product of that row and column (`acc[m * cols + j]`) is known
/// ([`index_after()`]): after the products, before the reductions, so that the load's latency
/// hides behind them and the load stays below the kernel's `griddepcontrol.wait`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn residuals_ahead<F: Float>(
    residual: &[F],
    residual_f: &mut Array<f32>,
    col0: usize,
    n: usize,
    acc: &Array<f32>,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] bp: EpilogueBlueprint,
) {
    #[unroll]
    for m in 0..rows {
        #[unroll]
        for j in 0..cols {
            let col = min(col0 + j, n - 1);
            let at = index_after(m * n + col, acc[m * cols + j], m * n);
            residual_f[m * cols + j] = residual_value::<F>(residual, at, bp);
        }
    }
}

/// [`write_epilogue()`] for a kernel that may have loaded the bias and residual ahead: with
/// `ahead`, from `bias_f` and `residual_f` ([`bias_value()`], [`residual_value()`]), else from
/// `bias` and `residual` now.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn write_epilogue_ahead<F: Float>(
    out: &mut [F],
    acc: f32,
    up: f32,
    row: usize,
    col: usize,
    n: usize,
    bias: &[F],
    residual: &[F],
    bias_f: f32,
    residual_f: f32,
    #[comptime] ahead: bool,
    #[comptime] bp: EpilogueBlueprint,
) {
    if comptime![ahead] {
        out[row * n + col] = epilogue_loaded::<F>(acc, up, bias_f, residual_f, bp);
    } else {
        write_epilogue::<F>(out, acc, up, row, col, n, bias, residual, bp);
    }
}

/// The dequantizing epilogue of the 8-bit GEMMs: `acc · sa · sb`, then [`epilogue_value()`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DequantBlueprint {
    /// `sa` holds one scale for the whole activation (`sa[0]`), else one per row (`sa[row]`).
    pub sa_scalar: bool,
    /// `sb` holds one scale for the whole weight (`sb[0]`), else one per column (`sb[col]`).
    pub sb_scalar: bool,
    /// What follows the scaling (a gate is not meaningful here: there is no up accumulator).
    pub epilogue: EpilogueBlueprint,
}

/// `scales[0]` when `scalar`, else `scales[i]`.
#[cube]
pub fn scale_at(scales: &[f32], i: usize, #[comptime] scalar: bool) -> f32 {
    if comptime![scalar] {
        scales[0]
    } else {
        scales[i]
    }
}

/// The dequantizing epilogue of one output element: `(acc · sa[row]) · sb[col]` (or the scalar
/// scales), `+ bias[col]`, `+ residual[row, col]`, rounded once to `F`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn dequant_epilogue<F: Float>(
    acc: f32,
    row: usize,
    col: usize,
    n: usize,
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    #[comptime] bp: DequantBlueprint,
) -> F {
    let a = scale_at(sa, row, bp.sa_scalar);
    dequant_epilogue_scaled::<F>(acc * a, row, col, n, sb, bias, residual, bp)
}

/// [`dequant_epilogue()`] for an accumulator already multiplied by its row's activation scale
/// (kernels that quantize the activation themselves hold that scale in shared memory).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn dequant_epilogue_scaled<F: Float>(
    acc_a: f32,
    row: usize,
    col: usize,
    n: usize,
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    #[comptime] bp: DequantBlueprint,
) -> F {
    let y = acc_a * scale_at(sb, col, bp.sb_scalar);
    epilogue_value::<F>(y, 0f32, row, col, n, bias, residual, bp.epilogue)
}

/// Edge of a tensor-core fragment (16x16x16 `cmma`).
pub const FRAG: usize = 16;

/// How a plane's accumulator fragments are laid out, for [`write_fragments()`]: `frags_m x
/// frags_n` fragments in the `Sequence`, fragment `(i, j)` at index `i * frags_n + j`. Gated,
/// the first `frags_n / 2` columns of fragments are gate products and the others the matching
/// up products (column `j` pairs with `j + frags_n / 2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentGrid {
    pub frags_m: usize,
    pub frags_n: usize,
    /// Planes of the cube (each has its own scratch).
    pub planes: usize,
}

impl FragmentGrid {
    /// Output fragments per row of fragments.
    pub fn out_frags_n(&self, gated: bool) -> usize {
        if gated {
            self.frags_n / 2
        } else {
            self.frags_n
        }
    }

    /// f32 elements of scratch per plane (one fragment, two when gated).
    pub fn scratch_per_plane(&self, gated: bool) -> usize {
        if gated {
            2 * FRAG * FRAG
        } else {
            FRAG * FRAG
        }
    }

    /// Bytes of shared memory [`write_fragments()`] declares for the cube.
    pub fn scratch_bytes(&self, gated: bool) -> usize {
        self.scratch_per_plane(gated) * self.planes * 4
    }
}

/// Writes a plane's f32 accumulator fragments with the epilogue. Output fragment `(i, j)`
/// covers rows `row0 + 16 i ..` and columns `col0 + 16 j ..` of the `[m, n]` output. Each
/// fragment (and, gated, its up twin) is stored to the plane's 16x16 f32 scratch in shared
/// memory; then lane `l` takes row `l / 2`, 8 consecutive columns from `(l % 2) * 8`, and
/// writes them through [`write_epilogue()`] with bounds. Every plane of the cube must call this
/// (it declares the cube's scratch); `plane` and `lane` are the caller's position (32 lanes).
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn write_fragments<F: Float>(
    accs: &Sequence<cmma::Matrix<f32>>,
    out: &mut [F],
    bias: &[F],
    residual: &[F],
    row0: usize,
    col0: usize,
    m: usize,
    n: usize,
    plane: usize,
    lane: usize,
    #[comptime] grid: FragmentGrid,
    #[comptime] bp: EpilogueBlueprint,
) {
    let frag_elems = FRAG * FRAG;
    let per_plane = comptime![grid.scratch_per_plane(bp.is_gated())];
    let mut scratch =
        Shared::<[f32]>::new_aligned_slice(comptime![per_plane * grid.planes], 128usize);
    let s0 = plane * per_plane;
    let r_in = lane / 2;
    let c_in = (lane % 2) * 8;
    let fnn = comptime![grid.frags_n];
    let ofn = comptime![grid.out_frags_n(bp.is_gated())];
    #[unroll]
    for i in 0..grid.frags_m {
        #[unroll]
        for j in 0..ofn {
            cmma::store(
                &mut scratch[s0..s0 + frag_elems],
                accs.index(i * fnn + j),
                FRAG as u32,
                cmma::MatrixLayout::RowMajor,
            );
            if comptime![bp.is_gated()] {
                cmma::store(
                    &mut scratch[s0 + frag_elems..s0 + 2 * frag_elems],
                    accs.index(i * fnn + j + ofn),
                    FRAG as u32,
                    cmma::MatrixLayout::RowMajor,
                );
            }
            sync_plane();
            let row = row0 + i * FRAG + r_in;
            let col_base = col0 + j * FRAG + c_in;
            if row < m {
                #[unroll]
                for c in 0..8usize {
                    let col = col_base + c;
                    if col < n {
                        let at = s0 + r_in * FRAG + c_in + c;
                        let acc = scratch[at];
                        let up = if comptime![bp.is_gated()] {
                            scratch[at + frag_elems]
                        } else {
                            f32::new(0.0)
                        };
                        write_epilogue::<F>(out, acc, up, row, col, n, bias, residual, bp);
                    }
                }
            }
            sync_plane();
        }
    }
}
