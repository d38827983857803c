//! Skinny products for decode (M <= 16): `y[m, n] = Σ_k x[m, k] w[n, k]` (+ bias, + residual),
//! and the gated variant `act(x·gateᵀ) * (x·upᵀ)`.
//!
//! Bandwidth-bound: the weight is read once, row by row. Each plane owns one output column `n`
//! (one row of `w`, contiguous in memory), its lanes stride over K with 16-byte vector loads and
//! keep one f32 accumulator per row of x; a plane reduction (or, without plane ops, a
//! shared-memory one) finishes the dot products and lane 0 applies the epilogue. Several planes
//! share a cube so that x (a few KB, read by every plane) stays in L1.

use cubecl::prelude::*;

/// Comptime shape of a GEMV launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvPlan {
    /// Rows of x (1..=16), unrolled into per-row accumulators.
    pub m: u32,
    /// Lanes per output column: the plane size when plane ops are used, else 32.
    pub lanes: u32,
    /// Output columns per cube (one per plane).
    pub cols_per_cube: u32,
    pub use_plane: bool,
    pub has_bias: bool,
    pub has_residual: bool,
    /// Gated: two weight rows per column and `act(g) * u` in the epilogue.
    pub gated: bool,
    /// The gate activation when gated: false = SiLU, true = GELU (erf).
    pub gelu: bool,
}

/// `x` dot `w` for one vector, in f32.
#[cube]
fn dot<F: Float, N: Size>(a: Vector<F, N>, b: Vector<F, N>) -> f32 {
    let p = Vector::<f32, N>::cast_from(a) * Vector::<f32, N>::cast_from(b);
    let mut s = 0f32;
    #[unroll]
    for i in 0..p.vector_size() {
        s += p.extract(i);
    }
    s
}

/// The gate activations, in f32.
#[cube]
pub(crate) fn activation(g: f32, #[comptime] gelu: bool) -> f32 {
    // PyTorch's default F.gelu is the exact erf form.
    if comptime![gelu] {
        0.5f32 * g * (1f32 + Erf::erf(g * 0.707_106_77f32))
    } else {
        g / (1f32 + f32::exp(-g))
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<F, N>],
    w_up: &[Vector<F, N>],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    n_cols: usize,
    k_vectors: usize,
    up_row_offset: usize,
    #[comptime] plan: GemvPlan,
    #[define(F)] _dtype: ElemType,
) {
    let col = CUBE_POS * plan.cols_per_cube as usize + UNIT_POS_Y as usize;
    // Out-of-range columns still take part in the (shared-memory) reduction's barriers.
    let active = col < n_cols;
    let row = select(active, col, 0);
    let m_rows = comptime![plan.m as usize];
    let mut acc = Array::<f32>::new(m_rows);
    let mut acc_up = Array::<f32>::new(m_rows);
    #[unroll]
    for m in 0..m_rows {
        acc[m] = 0f32;
        acc_up[m] = 0f32;
    }
    let w_base = row * k_vectors;
    let up_base = (up_row_offset + row) * k_vectors;
    for kv in range_stepped(UNIT_POS_X as usize, k_vectors, plan.lanes as usize) {
        let wv = w[w_base + kv];
        #[unroll]
        for m in 0..m_rows {
            acc[m] += dot(x[m * k_vectors + kv], wv);
        }
        if comptime![plan.gated] {
            let uv = w_up[up_base + kv];
            #[unroll]
            for m in 0..m_rows {
                acc_up[m] += dot(x[m * k_vectors + kv], uv);
            }
        }
    }
    #[unroll]
    for m in 0..m_rows {
        let total = crate::reduce::row_sum(acc[m], plan.lanes, plan.cols_per_cube, plan.use_plane);
        let mut total_up = 0f32;
        if comptime![plan.gated] {
            total_up =
                crate::reduce::row_sum(acc_up[m], plan.lanes, plan.cols_per_cube, plan.use_plane);
        }
        if active && UNIT_POS_X == 0 {
            let mut y = total;
            if comptime![plan.gated] {
                // Round each product to the activation dtype first, as two linears would.
                let g = f32::cast_from(F::cast_from(y));
                let u = f32::cast_from(F::cast_from(total_up));
                y = activation(g, plan.gelu) * u;
            }
            if comptime![plan.has_bias] {
                y += f32::cast_from(bias[col]);
            }
            if comptime![plan.has_residual] {
                y += f32::cast_from(residual[m * n_cols + col]);
            }
            out[m * n_cols + col] = F::cast_from(y);
        }
    }
}
