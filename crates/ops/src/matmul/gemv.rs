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
//! With programmatic dependent launch ([`caps::has_pdl`]) each unit loads its first weight
//! vectors before `griddepcontrol.wait`, so they stream while the kernel before finishes; with
//! K = 1536 and 4 planes per column that is most of a unit's weights.
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
use crate::gemm::{
    ahead_sums, bias_value, residuals_ahead, write_epilogue_ahead, EpilogueBlueprint, AHEAD_ROWS,
};
use crate::norm::sum_squares;
use crate::pdl::wait_after;
use crate::reduce::{row_sum_split_in, row_sums_shared_len, row_sums_split_in};

#[cfg(test)]
mod cuda_source;

/// Comptime shape of a GEMV launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvBlueprint {
    /// Rows of x (1..=16), unrolled into per-row accumulators.
    pub m: u32,
    /// Lanes per plane-sized group: the plane size when plane ops are used, else 32.
    pub lanes: u32,
    /// Plane-sized groups per output column, each over an interleaved share of K.
    pub splits: u32,
    /// Output columns per cube.
    pub cols_per_cube: u32,
    pub use_plane: bool,
    /// x goes through an RMSNorm first (its statistics summed by each column's units alongside
    /// the dot products).
    pub norm: bool,
    /// Gated (`epilogue.gate`): two weight rows per column and `act(g) * u` in the epilogue.
    pub epilogue: EpilogueBlueprint,
    /// Signal `griddepcontrol.launch_dependents` once the weights are read (see
    /// [`caps::has_launch_dependents`]), so the next kernel's launch overlaps the reductions.
    pub trigger: bool,
    /// Load each unit's first weight vector before `griddepcontrol.wait` (see
    /// [`caps::has_pdl`]): a short K (qkv, o: about 1.5 vectors per unit) is then mostly in
    /// flight while the kernel before finishes.
    pub early_wait: bool,
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
pub(crate) fn dot<F: Float, N: Size>(a: Vector<F, N>, b: Vector<F, N>) -> f32 {
    let p = Vector::<f32, N>::cast_from(a) * Vector::<f32, N>::cast_from(b);
    let mut s = 0f32;
    #[unroll]
    for i in 0..p.vector_size() {
        s += p.extract(i);
    }
    s
}

/// Adds one K vector's products to every row's accumulators: `w`'s (and the gated `u`'s) dot
/// products with x, scaled on the fly by the norm weight `g`, and x's squares for the norm.
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_vector<F: Float, N: Size>(
    x: &[Vector<F, N>],
    wv: Vector<F, N>,
    uv: Vector<F, N>,
    gv: Vector<F, N>,
    kv: usize,
    k_vectors: usize,
    acc: &mut Array<f32>,
    acc_up: &mut Array<f32>,
    squares: &mut Array<f32>,
    #[comptime] m_rows: usize,
    #[comptime] normed: bool,
    #[comptime] gated: bool,
) {
    #[unroll]
    for m in 0..m_rows {
        let xv = x[m * k_vectors + kv];
        if normed {
            squares[m] += sum_squares(xv);
            acc[m] += dot3(xv, gv, wv);
            if gated {
                acc_up[m] += dot3(xv, gv, uv);
            }
        } else {
            acc[m] += dot(xv, wv);
            if gated {
                acc_up[m] += dot(xv, uv);
            }
        }
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
    norm_weight: &[Vector<F, N>],
    n_cols: usize,
    k_vectors: usize,
    up_row_offset: usize,
    inv_k: f32,
    eps: f32,
    #[comptime] plan: GemvBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let col = CUBE_POS * plan.cols_per_cube as usize + UNIT_POS_Y as usize;
    // Out-of-range columns still take part in the (shared-memory) reductions' barriers.
    let active = col < n_cols;
    let row = select(active, col, 0);
    let m_rows = comptime![plan.m as usize];
    let lanes = comptime![(plan.lanes * plan.splits) as usize];
    let gated = comptime![plan.epilogue.is_gated()];

    let normed = comptime![plan.norm];
    let mut acc = Array::<f32>::new(m_rows);
    let mut acc_up = Array::<f32>::new(m_rows);
    // With the input norm: each column's units also sum x's squares over all of K (they read
    // every x vector anyway), so no cube waits on a norm reduction before its first weight load.
    let mut squares = Array::<f32>::new(m_rows);
    #[unroll]
    for m in 0..m_rows {
        acc[m] = 0f32;
        acc_up[m] = 0f32;
        squares[m] = 0f32;
    }
    let w_base = row * k_vectors;
    let up_base = (up_row_offset + row) * k_vectors;
    let first = UNIT_POS_X as usize;
    let mut start = first;
    // The epilogue's bias and residual, loaded by the unit that writes the column ahead of their
    // use (the bias, a weight, with the first weight vectors; the residual right after the
    // products, before the reductions): loaded in the epilogue, ptxas issued them after the
    // reductions, and the whole latency of the load sat between the last product and the store.
    let writer = active && UNIT_POS_X == 0;
    let preload = comptime![plan.m <= AHEAD_ROWS];
    let mut bias_f = 0f32;
    let mut residual_f = Array::<f32>::new(m_rows);
    if comptime![preload] && writer {
        bias_f = bias_value::<F>(bias, col, plan.epilogue);
    }
    if comptime![plan.early_wait] {
        // Weights are never written by a kernel: the first vectors load while the kernel
        // before this one finishes; x and the outputs wait for it. The first vector is
        // consumed outside the loop so that the loop body stays branch-free.
        let mut w0 = Vector::<F, N>::new(F::new(0.0));
        let mut u0 = w0;
        let mut g0 = w0;
        let has_first = first < k_vectors;
        if has_first {
            w0 = w[w_base + first];
            if gated {
                u0 = w_up[up_base + first];
            }
            if normed {
                g0 = norm_weight[first];
            }
        }
        // w, w_up, bias and norm_weight: the parameters read before the wait (`crate::pdl`).
        gpu_asm!("// cubellm.early_params 1 2 3 6");
        if comptime![preload && plan.epilogue.has_bias] {
            // Pinned below the loads: with the bias's load before it, ptxas scheduled a bare
            // wait above every load (see `wait_after`).
            let dep =
                u32::reinterpret(f32::cast_from(w0.extract(0usize))) ^ u32::reinterpret(bias_f);
            wait_after(dep);
        } else {
            gpu_asm!("griddepcontrol.wait;");
        }
        if has_first {
            accumulate_vector::<F, N>(
                x,
                w0,
                u0,
                g0,
                first,
                k_vectors,
                &mut acc,
                &mut acc_up,
                &mut squares,
                m_rows,
                normed,
                gated,
            );
        }
        start = first + lanes;
    }
    for kv in range_stepped(start, k_vectors, lanes) {
        let wv = w[w_base + kv];
        let mut uv = wv;
        if gated {
            uv = w_up[up_base + kv];
        }
        let mut gv = wv;
        if normed {
            gv = norm_weight[kv];
        }
        accumulate_vector::<F, N>(
            x,
            wv,
            uv,
            gv,
            kv,
            k_vectors,
            &mut acc,
            &mut acc_up,
            &mut squares,
            m_rows,
            normed,
            gated,
        );
    }
    if comptime![preload] && writer {
        residuals_ahead::<F>(
            residual,
            &mut residual_f,
            col,
            n_cols,
            &acc,
            m_rows,
            1usize,
            plan.epilogue,
        );
    }
    if comptime![plan.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }
    // One reduction buffer for all of them (see `row_sum_split_in`).
    let mut red = Shared::<[f32]>::new_slice(comptime![plan.shared_len()]);
    // Up to AHEAD_ROWS rows every sum is reduced in one pass (the products, the up products,
    // x's squares: `plan.sums()` values, in that order); above, one value at a time, which keeps
    // fewer of them live in the 16-row kernels.
    let mut sums = Array::<f32>::new(comptime![plan.sums()]);
    if comptime![preload] {
        #[unroll]
        for m in 0..m_rows {
            sums[m] = acc[m];
            if gated {
                sums[m_rows + m] = acc_up[m];
            }
            if normed {
                sums[comptime![plan.sums()] - m_rows + m] = squares[m];
            }
        }
        row_sums_split_in(
            &mut sums,
            &mut red,
            comptime![plan.sums()],
            plan.lanes,
            plan.splits,
            plan.use_plane,
        );
    }
    #[unroll]
    for m in 0..m_rows {
        let mut total: f32;
        let mut total_up = 0f32;
        if comptime![preload] {
            total = sums[m];
            if gated {
                total_up = sums[m_rows + m];
            }
        } else {
            total = row_sum_split_in(acc[m], &mut red, plan.lanes, plan.splits, plan.use_plane);
            if gated {
                total_up =
                    row_sum_split_in(acc_up[m], &mut red, plan.lanes, plan.splits, plan.use_plane);
            }
        }
        if normed {
            let sq = if comptime![preload] {
                sums[comptime![plan.sums()] - m_rows + m]
            } else {
                row_sum_split_in(
                    squares[m],
                    &mut red,
                    plan.lanes,
                    plan.splits,
                    plan.use_plane,
                )
            };
            let inv_rms = f32::inverse_sqrt(sq * inv_k + eps);
            total *= inv_rms;
            total_up *= inv_rms;
        }
        if writer {
            write_epilogue_ahead::<F>(
                out,
                total,
                total_up,
                m,
                col,
                n_cols,
                bias,
                residual,
                bias_f,
                residual_f[m],
                preload,
                plan.epilogue,
            );
        }
    }
}

impl GemvBlueprint {
    /// The sums the epilogue reduces in one pass ([`ahead_sums`], one column a group).
    fn sums(&self) -> usize {
        ahead_sums(self.m, 1, self.epilogue.is_gated(), self.norm)
    }

    /// f32s of the epilogue's shared reduction buffer (one value's where they reduce one at a
    /// time).
    fn shared_len(&self) -> usize {
        let (lanes, splits, rows) = (self.lanes, self.splits, self.cols_per_cube);
        row_sums_shared_len(self.sums(), lanes, splits, rows, self.use_plane)
    }
}

/// What a GEMV launch plan takes from the device.
#[derive(Clone, Copy, Debug)]
pub(super) struct GemvDevice {
    pub sms: u32,
    /// Lanes per plane-sized group, and whether they reduce through plane operations
    /// ([`gemv_lanes`]).
    pub lanes: u32,
    pub use_plane: bool,
    pub trigger: bool,
    pub early_wait: bool,
}

impl GemvDevice {
    pub fn of<R: Runtime>(client: &ComputeClient<R>) -> Self {
        let (lanes, use_plane) = gemv_lanes(client);
        Self {
            sms: caps::num_sms(client),
            lanes,
            use_plane,
            trigger: caps::has_launch_dependents(client),
            early_wait: caps::has_pdl(client),
        }
    }
}

/// The blueprint, the cube's shape and the cube count of a launch of `m` rows and `n` columns
/// over `k_vectors` vectors, with `splits` groups per column or, for `None`, [`gemv_splits`]'s
/// choice.
pub(super) fn launch_plan(
    [m, n, k_vectors]: [usize; 3],
    splits: Option<u32>,
    norm: bool,
    epilogue: EpilogueBlueprint,
    device: GemvDevice,
) -> (GemvBlueprint, CubeDim, u32) {
    let lanes = device.lanes;
    let splits = splits.unwrap_or_else(|| gemv_splits(device.sms, n, k_vectors, lanes));
    let cols_per_cube = (256 / (lanes * splits)).max(1);
    let bp = GemvBlueprint {
        m: m as u32,
        lanes,
        splits,
        cols_per_cube,
        use_plane: device.use_plane,
        norm,
        epilogue,
        trigger: device.trigger,
        early_wait: device.early_wait,
    };
    let cubes = n.div_ceil(cols_per_cube as usize) as u32;
    (bp, CubeDim::new_2d(lanes * splits, cols_per_cube), cubes)
}

/// Launches the GEMV on a validated problem (M <= 16), with `splits` groups per column (1, 2, 4
/// or 8) or, for `None`, [`gemv_splits`]'s choice.
pub(super) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    splits: Option<u32>,
) {
    let vector = caps::vector_size_for(client, p.x.dtype(), p.k);
    let k_vectors = p.k / vector;
    let (bp, cube_dim, cubes) = launch_plan(
        [p.m, p.n, k_vectors],
        splits,
        p.norm.is_some(),
        p.epilogue(),
        GemvDevice::of(client),
    );
    let (norm_weight, eps) = match p.norm {
        Some(n) => (n.weight, n.eps),
        None => (p.x, 0.0),
    };
    launch_dense!(gemv_kernel::<R>(
        client,
        crate::launch::cube_count_1d(client, cubes),
        cube_dim,
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

/// The lanes of a GEMV's plane-sized groups and whether they reduce through plane operations:
/// the plane size where the runtime has plane ops of one fixed width, else 32 lanes reducing
/// through shared memory.
pub fn gemv_lanes<R: Runtime>(client: &ComputeClient<R>) -> (u32, bool) {
    let use_plane = caps::has_plane_ops(client)
        && client.properties().hardware.plane_size_min
            == client.properties().hardware.plane_size_max;
    let lanes = if use_plane {
        caps::plane_size_min(client)
    } else {
        32
    };
    (lanes, use_plane)
}

/// Plane-sized groups per output column of a GEMV over `k_vectors` 16-byte weight vectors per
/// column: enough planes overall for about 32 per SM (the LM head's 151 936 columns need no
/// split, a 1536-column projection 4), a power of two up to 8, and at least one 16-byte load per
/// lane, on a device of `sms` SMs.
pub fn gemv_splits(sms: u32, n: usize, k_vectors: usize, lanes: u32) -> u32 {
    let want = 32 * sms.max(1) as usize;
    let by_occupancy = want.div_ceil(n.max(1)).next_power_of_two().clamp(1, 8);
    let by_length = (k_vectors / lanes as usize).max(1);
    let mut splits = by_occupancy;
    while splits > 1 && splits > by_length {
        splits /= 2;
    }
    splits as u32
}
