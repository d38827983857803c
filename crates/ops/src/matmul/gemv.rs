//! Skinny products for decode (M <= 16): `y[m, n] = Σ_k x̂[m, k] w[n, k]` (+ bias, + residual),
//! and the gated variant `act(x̂·gateᵀ) * (x̂·upᵀ)`, where `x̂` is `x` or, with an input norm,
//! `rms_norm(x, g, eps)` computed by the kernel itself.
//!
//! Bandwidth-bound: the weight is read once, row by row. Each output column `n` (one row of `w`,
//! contiguous in memory) belongs to `splits` planes of the cube, whose lanes stride over K with
//! 16-byte vector loads and keep one f32 accumulator per row of x; a plane reduction (or, without
//! plane ops, a shared-memory one), then a shared-memory sum over the splits, finishes the dot
//! products and lane 0 applies the epilogue. Several columns share a cube so that x (a few KB,
//! read by every plane) stays in L1.
//!
//! The split exists for the short projections: with one plane per column, a 1536-column
//! projection runs 1536 planes, about 12 per SM of an H100/H200, too few loads in flight to
//! cover the memory latency (the 1.5B model's `o` and `down` streamed at 1.4 and 2.3 TB/s of an
//! H200's 4.3). Splitting K over up to 8 planes per column aims at about 32 planes per SM: the
//! 1.5B model's decode went from 652 to 702 tok/s on an H200.
//!
//! On CUDA sm_90+ each cube signals `griddepcontrol.launch_dependents` once its weight loop is
//! done, so the next kernel launches during the reductions and epilogue (+1.7% decode on the 1.5B
//! model on an H200, 702 → 714 tok/s).
//!
//! (Keeping several weight loads in flight per lane by hand, with register arrays refilled a
//! batch ahead, measured slower on an H200: the 1.5B model's LM head 105 → 202 µs, gate-up 17 →
//! 31 µs; the plain loop, which the compiler pipelines itself, stays.)
//!
//! The input norm (the pre-norm block's RMSNorm folded into the projection that consumes it):
//! `y = rstd · Σ_k x_k g_k w_k` with `rstd = 1 / sqrt(mean(x²) + eps)`. Each column's units sum
//! x's squares over K in the same loop as the dot products (they read every x vector anyway), so
//! no cube waits on a norm reduction before its first weight load, and `rstd` scales the reduced
//! dot product in the epilogue. The normalised x is never rounded to the dtype, unlike
//! [`crate::norm::rms_norm`] (`F(F(x · rstd) · g)`): the fused result is the unfused one up to
//! that rounding. That saves the norm's launch (about 1.8 µs per norm on an H200).

use cubecl::prelude::*;

use super::Problem;
use crate::caps;
use crate::gemm::{write_epilogue, EpilogueBlueprint};
use crate::norm::sum_squares;
use crate::reduce::{row_sum_shared_len, row_sum_split_in};

/// Comptime shape of a GEMV launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvBlueprint {
    /// Rows of x (1..=16), unrolled into per-row accumulators.
    pub m: u32,
    /// Lanes per plane-sized group: the plane size when plane ops are used, else 32.
    pub lanes: u32,
    /// Plane-sized groups per output column, each over an interleaved share of K.
    pub splits: u32,
    /// Units along y per cube; each owns `cols_per_unit` consecutive output columns.
    pub cols_per_cube: u32,
    /// Output columns per unit: each x vector loaded is used for all of them, which keeps a
    /// several-row GEMV from being bound by the x loads (1 for one row).
    pub cols_per_unit: u32,
    pub use_plane: bool,
    /// x goes through an RMSNorm first (its statistics summed by each column's units alongside
    /// the dot products).
    pub norm: bool,
    /// Gated (`epilogue.gate`): two weight rows per column and `act(g) * u` in the epilogue.
    pub epilogue: EpilogueBlueprint,
    /// Signal `griddepcontrol.launch_dependents` once the weights are read (see
    /// [`caps::has_launch_dependents`]), so the next kernel's launch overlaps the reductions.
    pub trigger: bool,
}

/// `x` dot `(g * w)` for one vector, in f32 (the input norm's weight `g` applied on the fly).
#[cube]
fn dot3<F: Float, N: Size>(a: Vector<F, N>, g: Vector<F, N>, b: Vector<F, N>) -> f32 {
    let p = Vector::<f32, N>::cast_from(a)
        * Vector::<f32, N>::cast_from(g)
        * Vector::<f32, N>::cast_from(b);
    let mut s = 0f32;
    #[unroll]
    for i in 0..p.vector_size() {
        s += p.extract(i);
    }
    s
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

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_kernel<F: Float, N: Size>(
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
    #[comptime] plan: GemvBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let c_cols = comptime![plan.cols_per_unit as usize];
    // This unit's first column; it owns `c_cols` consecutive ones. Out-of-range columns still
    // take part in the (shared-memory) reductions' barriers.
    let col0 = (CUBE_POS * plan.cols_per_cube as usize + UNIT_POS_Y as usize) * c_cols;
    let m_rows = comptime![plan.m as usize];
    let lanes = comptime![(plan.lanes * plan.splits) as usize];
    let gated = comptime![plan.epilogue.is_gated()];

    let normed = comptime![plan.norm];
    // Every value the unit sums over K, in one register array: the products `[c][m]`, then the
    // up products (gated), then the squares of each row of x (with the input norm: each
    // column's units sum them in the same loop as the products, as they read every x vector
    // anyway, so no cube waits on a norm reduction before its first weight load).
    let mc = comptime![m_rows * c_cols];
    let up_off = mc;
    let sq_off = comptime![mc * (1 + plan.epilogue.is_gated() as usize)];
    let n_vals = comptime![sq_off + plan.norm as usize * m_rows];
    let mut vals = Array::<f32>::new(n_vals);
    #[unroll]
    for i in 0..n_vals {
        vals[i] = 0f32;
    }
    let mut xs = Array::<Vector<F, N>>::new(m_rows);
    let mut w_base = Array::<usize>::new(c_cols);
    let mut up_base = Array::<usize>::new(c_cols);
    #[unroll]
    for c in 0..c_cols {
        let row = select(col0 + c < n_cols, col0 + c, 0);
        w_base[c] = row * k_vectors;
        up_base[c] = (up_row_offset + row) * k_vectors;
    }
    for kv in range_stepped(UNIT_POS_X as usize, k_vectors, lanes) {
        // x's rows are loaded once and used for every column of the unit.
        let mut gv = Vector::<F, N>::empty();
        if normed {
            gv = norm_weight[kv];
        }
        #[unroll]
        for m in 0..m_rows {
            xs[m] = x[m * k_vectors + kv];
            if normed {
                vals[sq_off + m] += sum_squares(xs[m]);
            }
        }
        #[unroll]
        for c in 0..c_cols {
            let wv = w[w_base[c] + kv];
            let mut uv = wv;
            if gated {
                uv = w_up[up_base[c] + kv];
            }
            #[unroll]
            for m in 0..m_rows {
                let i = c * m_rows + m;
                if normed {
                    vals[i] += dot3(xs[m], gv, wv);
                    if gated {
                        vals[up_off + i] += dot3(xs[m], gv, uv);
                    }
                } else {
                    vals[i] += dot(xs[m], wv);
                    if gated {
                        vals[up_off + i] += dot(xs[m], uv);
                    }
                }
            }
        }
    }
    if comptime![plan.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }
    reduce_units(&mut vals, n_vals, plan);
    if UNIT_POS_X == 0 {
        #[unroll]
        for c in 0..c_cols {
            let col = col0 + c;
            #[unroll]
            for m in 0..m_rows {
                let i = c * m_rows + m;
                let mut total = vals[i];
                let mut total_up = 0f32;
                if gated {
                    total_up = vals[up_off + i];
                }
                if normed {
                    let inv_rms = f32::inverse_sqrt(vals[sq_off + m] * inv_k + eps);
                    total *= inv_rms;
                    total_up *= inv_rms;
                }
                if col < n_cols {
                    write_epilogue::<F>(
                        out,
                        total,
                        total_up,
                        m,
                        col,
                        n_cols,
                        bias,
                        residual,
                        plan.epilogue,
                    );
                }
            }
        }
    }
}

/// Sums each value of `vals` over the units of its column (the `lanes * splits` units along x),
/// into the unit with x = 0. With plane operations: one plane sum per value, then, when K is
/// split over several planes, one exchange through shared memory for all values at once (one
/// barrier, not one per value); the splits are added in order, so a column's sum is the same
/// whatever else the kernel computes. Without plane operations: the shared-memory tree, value by
/// value. Every unit must call it.
#[cube]
fn reduce_units(vals: &mut Array<f32>, #[comptime] n_vals: usize, #[comptime] plan: GemvBlueprint) {
    let splits = comptime![plan.splits as usize];
    if comptime![plan.use_plane] {
        #[unroll]
        for v in 0..n_vals {
            vals[v] = plane_sum(vals[v]);
        }
        if comptime![splits > 1] {
            let mut sh = Shared::<[f32]>::new_slice(comptime![
                plan.cols_per_cube as usize * splits * n_vals
            ]);
            let group = UNIT_POS_Y as usize * splits;
            if UNIT_POS_PLANE == 0 {
                let base = (group + (UNIT_POS_X / plan.lanes) as usize) * n_vals;
                #[unroll]
                for v in 0..n_vals {
                    sh[base + v] = vals[v];
                }
            }
            sync_cube();
            if UNIT_POS_X == 0 {
                #[unroll]
                for v in 0..n_vals {
                    let mut t = 0f32;
                    #[unroll]
                    for sp in 0..splits {
                        t += sh[(group + sp) * n_vals + v];
                    }
                    vals[v] = t;
                }
            }
        }
    } else {
        let mut red = Shared::<[f32]>::new_slice(comptime![row_sum_shared_len(
            plan.lanes,
            plan.splits,
            plan.cols_per_cube,
            false
        )]);
        #[unroll]
        for v in 0..n_vals {
            vals[v] = row_sum_split_in(vals[v], &mut red, plan.lanes, plan.splits, false);
        }
    }
}

/// Launches the GEMV on a validated problem (M <= 16), with `splits` groups per column (1, 2, 4
/// or 8) or, for `None`, [`k_splits`]'s choice.
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    splits: Option<u32>,
) {
    let vector = caps::vector_size_for(client, p.x.dtype(), p.k);
    let use_plane = caps::has_plane_ops(client)
        && client.properties().hardware.plane_size_min
            == client.properties().hardware.plane_size_max;
    let lanes = if use_plane {
        caps::plane_size_min(client)
    } else {
        32
    };
    let k_vectors = p.k / vector;
    // Several columns per unit pay where the x loads bind (many rows on a fast device); the
    // software device without plane operations gets the smaller shader.
    let cols_per_unit = if use_plane {
        cols_per_unit(p.m, p.epilogue().is_gated())
    } else {
        1
    };
    let units_n = p.n.div_ceil(cols_per_unit as usize);
    let splits = splits.unwrap_or_else(|| k_splits(client, units_n, k_vectors, lanes));
    let trigger = caps::has_launch_dependents(client);
    let cols_per_cube = (256 / (lanes * splits)).max(1);
    let bp = GemvBlueprint {
        m: p.m as u32,
        lanes,
        splits,
        cols_per_cube,
        cols_per_unit,
        use_plane,
        norm: p.norm.is_some(),
        epilogue: p.epilogue(),
        trigger,
    };
    let (norm_weight, eps) = match p.norm {
        Some(n) => (n.weight, n.eps),
        None => (p.x, 0.0),
    };
    let cubes = units_n.div_ceil(cols_per_cube as usize) as u32;
    launch_dense!(gemv_kernel::<R>(
        client,
        crate::launch::cube_count_1d(client, cubes),
        CubeDim::new_2d(lanes * splits, cols_per_cube),
        p,
        [vector],
        [
            // Bound to x when there is no norm (never read then).
            norm_weight.as_buffer_arg(),
            p.n,
            k_vectors,
            p.up_row_offset,
            1.0 / p.k as f32,
            eps,
            bp,
            p.x.dtype().elem_type()
        ]
    ));
}

/// Output columns per unit for `m` rows of x: one for one row; for more, up to 4, with at most
/// 64 accumulators per unit (two per column and row when gated), so that each x vector loaded
/// serves several weight rows.
fn cols_per_unit(m: usize, gated: bool) -> u32 {
    if m <= 1 {
        return 1;
    }
    let per_col = m * if gated { 2 } else { 1 };
    (64 / per_col).clamp(1, 4) as u32
}

/// Plane-sized groups per output column: enough planes overall for about 32 per SM (the LM head's
/// 151 936 columns need no split, a 1536-column projection 4), a power of two up to 8, and at
/// least one 16-byte load per lane.
fn k_splits<R: Runtime>(client: &ComputeClient<R>, n: usize, k_vectors: usize, lanes: u32) -> u32 {
    let want = 32 * caps::num_sms(client).max(1) as usize;
    let by_occupancy = want.div_ceil(n.max(1)).next_power_of_two().clamp(1, 8);
    let by_length = (k_vectors / lanes as usize).max(1);
    let mut splits = by_occupancy;
    while splits > 1 && splits > by_length {
        splits /= 2;
    }
    splits as u32
}
