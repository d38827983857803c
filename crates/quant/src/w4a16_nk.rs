//! The column-major int4 layout of [`crate::W4A16Linear`] and its decode GEMV.
//!
//! The public [`crate::w4a16_linear`] takes `qweight[K/8, N]`: 8 int4 codes of one column (8
//! consecutive k) packed per i32, low nibble first, consecutive columns contiguous. A GEMV over that layout has to split K across cubes to keep all SMs busy
//! when N is small (1536 columns fill 48 cubes of 32 columns), so the layer stores its weight
//! transposed instead: `qweight_nk[N, K/8]` (each output channel's packed words contiguous, still
//! 8 consecutive k per word, low nibble first) with `scales_nk[N, K/g]`. Then the GEMV has the
//! shape of the bf16 one in `ops::matmul`: a group of lanes per output column (up to two planes,
//! as many as give the grid about [`WARPS_PER_SM`] warps per SM), striding over K with 16-byte
//! loads (32 weights each), a reduction at the end. The nibbles become floats in two
//! instructions each ([`crate::codec::nibble_exact`]). The
//! kernel applies the dense kernels' epilogue (bias, residual, the gated MLP's `act(g) * u` over
//! a `[2I, K/8]` gate-then-up weight), so a decode step needs no element-wise kernel after it.
//!
//! The GEMV is ALU-bound unless the work per weight stays a few instructions: every column reads
//! all of x, so converting x to f32 (and applying the input norm, `F(F(x · rstd) · g)`) per
//! column costs more than the nibble decoding. Where x fits (see [`stage_chunks`]), each cube
//! therefore converts (and normalises) x once into shared memory as f32 and the columns read it
//! from there; the values are the ones the per-column path computes, so both paths give the same
//! bits. The staged row is swizzled in 16-byte chunks so that the 8 lanes of a column, which
//! read chunks 128 bytes apart, hit different banks.

use cubecl::prelude::*;
use ops::gemm::{write_epilogue, EpilogueBlueprint};
use ops::matmul::InputNorm;
use ops::norm::{row_inv_rms, scale_by_weight};
use ops::reduce::row_sum_split_in;
use ops::reduce::ReducePlan;
use ops::{caps, DType, DeviceTensor, Result};

use crate::codec::nibble_exact;
use crate::host::Int4Weight;

/// Most units per cube.
const CUBE_UNITS: u32 = 256;
/// Warps per SM the launch aims for over the whole grid (units per column grow, up to one unit
/// per weight vector and two planes, until the grid has that many; registers then decide how
/// many are resident): the loads and the dependent FMA chains of fewer warps leave the SM idle.
/// On an H100 at the 1.5B model's shapes, 48 against 16 gave the gated MLP 16 lanes per column
/// instead of 8 (14.4 against 16.9 µs per layer, W4A16 decode 725 against 702 tok/s); 96 (32
/// lanes, two vectors each) measured slower (17.6 µs).
const WARPS_PER_SM: usize = 48;
/// Weight loads a lane keeps in flight per pass.
const MAX_LOADS: usize = 12;
/// Most bytes of shared memory the staged f32 copy of x may take (the 1.5B model's down
/// projection at one row: 35 KB).
const STAGE_MAX_BYTES: usize = 40 * 1024;

/// 16-byte chunks (4 f32) per staged row of x, or `None` where x is read from global memory per
/// column: x vectors of 4 or 8 elements (a staged chunk is whole vector lanes), and `m` rows
/// within [`STAGE_MAX_BYTES`] and the runtime's shared memory. Rows are padded to whole 8-chunk
/// swizzle blocks.
fn stage_chunks<R: Runtime>(
    client: &ComputeClient<R>,
    m: usize,
    k: usize,
    nx: usize,
) -> Option<u32> {
    let chunks = k.div_ceil(32) * 8;
    let bytes = m * chunks * 16;
    // Room for the reductions' buffers besides the staged rows.
    let room = client
        .properties()
        .hardware
        .max_shared_memory_size
        .saturating_sub(4096);
    (matches!(nx, 4 | 8) && bytes <= STAGE_MAX_BYTES.min(room)).then_some(chunks as u32)
}

/// Where 16-byte chunk `c` of a staged row lives: the chunk's position in its block of 8
/// (128 bytes, all 32 banks) xor the block's index, so that consecutive blocks start at
/// different banks.
#[cube]
fn swizzle(c: usize) -> usize {
    let block = c >> 3usize;
    (block << 3usize) | ((c & 7usize) ^ (block & 7usize))
}

/// `[K/8, N]` words and `[groups, N]` scales of `w`, transposed to `[N, K/8]` and `[N, groups]`.
pub(crate) fn transpose_to_nk(w: &Int4Weight) -> (Vec<i32>, Vec<f32>) {
    let (kw, n) = (w.k / 8, w.n);
    let groups = w.scales.len() / n;
    let mut packed = vec![0i32; kw * n];
    for (r, row) in w.packed.chunks(n).enumerate() {
        for (c, &word) in row.iter().enumerate() {
            packed[c * kw + r] = word;
        }
    }
    let mut scales = vec![0f32; groups * n];
    for (g, row) in w.scales.chunks(n).enumerate() {
        for (c, &s) in row.iter().enumerate() {
            scales[c * groups + g] = s;
        }
    }
    (packed, scales)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct NkPlan {
    /// Rows of x, unrolled into per-row accumulators.
    m: u32,
    /// Lanes per column (4..=32) in each split: the plane-sized groups that share a column.
    lanes: u32,
    /// Plane-sized groups per column (1 or 2), each over an interleaved share of K, summed
    /// through shared memory.
    splits: u32,
    /// Columns per cube (fewer where that leaves SMs without two cubes).
    cols: u32,
    use_plane: bool,
    /// Every weight vector lies in one scale group (one scale load per vector, not per word).
    scale_per_vector: bool,
    /// Bias, residual and the gated activation (`act(x·Gᵀ) * (x·Uᵀ)`, the up rows `up_offset`
    /// rows below the gate rows), applied as the dense kernels apply them.
    epilogue: EpilogueBlueprint,
    /// `Some`: x goes through an RMSNorm first (statistics reduced over the cube, applied to
    /// each x load as `ops::norm::rms_norm` rounds it).
    norm: Option<ReducePlan>,
    /// Weight vectors a lane loads per pass (all issued before the first is used).
    batch: u32,
    /// `Some(chunks)`: x (normalised, with the input norm) staged as f32 in shared memory, rows
    /// of `chunks` swizzled 16-byte chunks ([`stage_chunks`]).
    stage: Option<u32>,
    /// Load the first pass's weights before `griddepcontrol.wait` (`ops::caps::has_pdl`).
    early_wait: bool,
    /// Signal `griddepcontrol.launch_dependents` once the weights are read.
    trigger: bool,
}

impl NkPlan {
    /// Units per column, all splits: the stride of a unit's weight vectors.
    fn column_units(&self) -> u32 {
        self.lanes * self.splits
    }

    /// Weight rows per column: two when gated (gate, then up).
    fn halves(&self) -> usize {
        if self.epilogue.is_gated() {
            2
        } else {
            1
        }
    }
}

/// Adds `x[m, 8 kw ..] · q · s` over the `NW` words of weight vector `v` of row `row` to
/// `acc[acc_base + m]`. `s_vec` is the vector's scale when every word of it shares one.
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate<F: Float, NW: Size, NX: Size>(
    x: &[Vector<F, NX>],
    xs: &[Vector<f32, Const<4>>],
    wv: Vector<i32, NW>,
    scales: &[f32],
    s_vec: f32,
    row: usize,
    v: usize,
    k: usize,
    words_per_group: usize,
    groups: usize,
    norm_w: &[Vector<F, NX>],
    inv_rms: &Array<f32>,
    acc: &mut Array<f32>,
    #[comptime] acc_base: usize,
    #[comptime] plan: NkPlan,
) {
    let nw = wv.vector_size();
    let nx = x[0].vector_size();
    let x_loads = comptime![8 / nx];
    let kw0 = v * nw;
    let mut q = Array::<f32>::new(8usize);
    #[unroll]
    for wi in 0..nw {
        let kw = kw0 + wi;
        let mut s = s_vec;
        if !comptime![plan.scale_per_vector] {
            s = scales[row * groups + kw / words_per_group];
        }
        let word = wv.extract(wi);
        #[unroll]
        for j in 0..8u32 {
            q[j as usize] = nibble_exact(word, j);
        }
        #[unroll]
        for m in 0..comptime![plan.m as usize] {
            let mut d = 0f32;
            if comptime![plan.stage.is_some()] {
                let row = m * comptime![plan.stage.unwrap_or(0) as usize];
                #[unroll]
                for h in 0..2usize {
                    let xv = xs[row + swizzle(2 * kw + h)];
                    #[unroll]
                    for l in 0..4usize {
                        d += q[4 * h + l] * xv.extract(l);
                    }
                }
            } else {
                let base = (m * k + kw * 8) / nx;
                #[unroll]
                for xi in 0..x_loads {
                    let mut xv = x[base + xi];
                    if comptime![plan.norm.is_some()] {
                        xv = scale_by_weight(xv, norm_w[kw * 8 / nx + xi], inv_rms[m]);
                    }
                    #[unroll]
                    for l in 0..nx {
                        d += q[xi * nx + l] * f32::cast_from(xv.extract(l));
                    }
                }
            }
            acc[acc_base + m] += d * s;
        }
    }
}

/// The weight vectors (and, when every vector lies in one scale group, their scales) of one pass
/// of a lane: vector `base + j · lanes + lane` of each of the column's rows, zeros past K.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_pass<NW: Size>(
    qweight: &[Vector<i32, NW>],
    scales: &[f32],
    wr: &mut Array<Vector<i32, NW>>,
    sr: &mut Array<f32>,
    col: usize,
    up_offset: usize,
    base: usize,
    w_vectors: usize,
    words_per_group: usize,
    groups: usize,
    #[comptime] plan: NkPlan,
) {
    let nw = wr[0].vector_size();
    #[unroll]
    for j in 0..comptime![plan.batch as usize] {
        let v = base + j * comptime![plan.column_units() as usize] + UNIT_POS_X as usize;
        #[unroll]
        for half in 0..comptime![plan.halves()] {
            let row = col + half * up_offset;
            let mut wv = Vector::<i32, NW>::new(0i32);
            let mut s = 0f32;
            if v < w_vectors {
                wv = qweight[row * w_vectors + v];
                if comptime![plan.scale_per_vector] {
                    s = scales[row * groups + v * nw / words_per_group];
                }
            }
            wr[j * comptime![plan.halves()] + half] = wv;
            sr[j * comptime![plan.halves()] + half] = s;
        }
    }
}

/// Unit (x = lane, y = column in the cube): `out[m, col] = Σ_k x[m, k] · q[col, k] · s(col, k)`
/// followed by the epilogue. `NW` words per weight load (4 = 16 bytes where K/8 allows), `NX`
/// elements per x load. Each lane walks K in passes of `batch` vectors whose loads are all
/// issued before the first is used (one memory latency per pass, and at the 1.5B model's shapes
/// one pass); with PDL the first pass is loaded before waiting for the kernel before.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn w4a16_gemv_nk_kernel<F: Float, NW: Size, NX: Size>(
    x: &[Vector<F, NX>],
    qweight: &[Vector<i32, NW>],
    scales: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    norm_w: &[Vector<F, NX>],
    n: usize,
    k: usize,
    w_vectors: usize,
    words_per_group: usize,
    groups: usize,
    up_offset: usize,
    inv_k: f32,
    eps: f32,
    #[comptime] plan: NkPlan,
    #[define(F)] _dtype: ElemType,
) {
    let col = CUBE_POS * comptime![plan.cols as usize] + UNIT_POS_Y as usize;
    // Columns past N read column 0 (in bounds) and take part in the reduction; never written.
    let active = col < n;
    let c = select(active, col, 0);
    let m_rows = comptime![plan.m as usize];
    let lanes = comptime![plan.column_units() as usize];
    let gated = comptime![plan.epilogue.is_gated()];
    let halves = comptime![plan.halves()];
    let batch = comptime![plan.batch as usize];
    // One weight row per column, two when gated (the gate row, then the up row `up_offset`
    // below): accumulators `acc[half * M + m]`.
    let mut acc = Array::<f32>::new(comptime![2 * plan.m as usize]);
    #[unroll]
    for i in 0..comptime![2 * plan.m as usize] {
        acc[i] = 0f32;
    }
    let mut wr = Array::<Vector<i32, NW>>::new(comptime![plan.batch as usize * plan.halves()]);
    let mut sr = Array::<f32>::new(comptime![plan.batch as usize * plan.halves()]);
    load_pass::<NW>(
        qweight,
        scales,
        &mut wr,
        &mut sr,
        c,
        up_offset,
        0,
        w_vectors,
        words_per_group,
        groups,
        plan,
    );
    if comptime![plan.early_wait] {
        // Only weights were read so far (never written by any kernel): x waits for the kernel
        // before this one. qweight, scales, bias and norm_w are the parameters read before the
        // wait (`ops::pdl`).
        gpu_asm!("// cubellm.early_params 1 2 3 6");
        gpu_asm!("griddepcontrol.wait;");
    }
    // The norm's statistics: every cube reduces x's squares itself (x is a few KB), while the
    // first pass's weights are in flight.
    let mut inv_rms = Array::<f32>::new(m_rows);
    if comptime![plan.norm.is_some()] {
        let nx = x[0].vector_size();
        inv_rms =
            row_inv_rms::<F, NX>(x, k / nx, inv_k, eps, m_rows, comptime![plan.norm.unwrap()]);
    }
    // The staged copy of x: converted (and normalised) once per cube instead of once per column.
    let mut xs = Shared::<[Vector<f32, Const<4>>]>::new_slice(comptime![
        (plan.m * plan.stage.unwrap_or(1)) as usize
    ]);
    if comptime![plan.stage.is_some()] {
        let nx = x[0].vector_size();
        let per_vector = comptime![nx / 4];
        let row_vectors = k / nx;
        #[unroll]
        for m in 0..m_rows {
            let row = m * comptime![plan.stage.unwrap_or(0) as usize];
            for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
                let mut xv = x[m * row_vectors + i];
                if comptime![plan.norm.is_some()] {
                    xv = scale_by_weight(xv, norm_w[i], inv_rms[m]);
                }
                #[unroll]
                for t in 0..per_vector {
                    let mut c = Vector::<f32, Const<4>>::new(0f32);
                    #[unroll]
                    for l in 0..4usize {
                        c.insert(l, f32::cast_from(xv.extract(4 * t + l)));
                    }
                    xs[row + swizzle(i * per_vector + t)] = c;
                }
            }
        }
        sync_cube();
    }
    let pass = lanes * batch;
    let passes = w_vectors.div_ceil(pass);
    for p in 0..passes {
        if p > 0 {
            load_pass::<NW>(
                qweight,
                scales,
                &mut wr,
                &mut sr,
                c,
                up_offset,
                p * pass,
                w_vectors,
                words_per_group,
                groups,
                plan,
            );
        }
        #[unroll]
        for j in 0..batch {
            let v = p * pass + j * lanes + UNIT_POS_X as usize;
            if v < w_vectors {
                #[unroll]
                for half in 0..halves {
                    let row = c + half * up_offset;
                    accumulate::<F, NW, NX>(
                        x,
                        &xs,
                        wr[j * halves + half],
                        scales,
                        sr[j * halves + half],
                        row,
                        v,
                        k,
                        words_per_group,
                        groups,
                        norm_w,
                        &inv_rms,
                        &mut acc,
                        comptime![half * plan.m as usize],
                        plan,
                    );
                }
            }
        }
    }
    if comptime![plan.trigger] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }
    // One reduction buffer for every row (see `ops::reduce::row_sum_split_in`).
    let mut red = Shared::<[f32]>::new_slice(comptime![ops::reduce::row_sum_shared_len(
        plan.lanes,
        plan.splits,
        plan.cols,
        plan.use_plane
    )]);
    #[unroll]
    for m in 0..m_rows {
        let total = row_sum_split_in(acc[m], &mut red, plan.lanes, plan.splits, plan.use_plane);
        let mut total_up = 0f32;
        if gated {
            let up = acc[m_rows + m];
            total_up = row_sum_split_in(up, &mut red, plan.lanes, plan.splits, plan.use_plane);
        }
        if active && UNIT_POS_X == 0 {
            write_epilogue::<F>(
                out,
                total,
                total_up,
                m,
                col,
                n,
                bias,
                residual,
                plan.epilogue,
            );
        }
    }
}

/// What follows the int4 product in [`gemv_nk`]: bias `[N]`, residual `[M, N]` (the output's
/// shape), or the gated activation (then the weight holds `2N` rows, gate then up).
pub(crate) struct NkEpilogue<'a, R: Runtime> {
    pub bias: Option<&'a DeviceTensor<R>>,
    pub residual: Option<&'a DeviceTensor<R>>,
    pub gate: Option<ops::matmul::Activation>,
    /// An RMSNorm of x (weight `[K]` of x's dtype) applied before the product.
    pub norm: Option<InputNorm<'a, R>>,
}

impl<'a, R: Runtime> NkEpilogue<'a, R> {
    /// The kernels' comptime description of bias, residual and gate.
    pub(crate) fn blueprint(&self) -> EpilogueBlueprint {
        EpilogueBlueprint {
            has_bias: self.bias.is_some(),
            has_residual: self.residual.is_some(),
            gate: self.gate,
        }
    }

    /// The tensors bound for bias, residual and the norm's weight, and the norm's eps: absent
    /// ones are bound to x and never read (the blueprint skips them).
    #[allow(clippy::type_complexity)]
    pub(crate) fn operands(
        &self,
        x: &'a DeviceTensor<R>,
    ) -> (
        &'a DeviceTensor<R>,
        &'a DeviceTensor<R>,
        &'a DeviceTensor<R>,
        f32,
    ) {
        let (norm_w, eps) = self.norm.map_or((x, 0.0), |n| (n.weight, n.eps));
        (
            self.bias.unwrap_or(x),
            self.residual.unwrap_or(x),
            norm_w,
            eps,
        )
    }
}

/// The GEMV on validated operands: `x[M <= 16, K]` contiguous float, `qweight_nk[N, K/8]`
/// (`[2N, K/8]` when gated), `scales_nk[.., K/group]` f32, `out[M, N]` of x's dtype.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_nk<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight_nk: &DeviceTensor<R>,
    scales_nk: &DeviceTensor<R>,
    group: usize,
    epilogue: NkEpilogue<'_, R>,
    out: &DeviceTensor<R>,
    m: usize,
    k: usize,
    n: usize,
) -> Result<()> {
    let k_words = k / 8;
    let nw = [4usize, 2]
        .into_iter()
        .find(|&w| k_words.is_multiple_of(w))
        .unwrap_or(1);
    let words_per_group = group / 8;
    // x loads of up to 16 bytes that divide a word's 8 values.
    let nx = [8usize, 4, 2]
        .into_iter()
        .find(|&v| v * x.dtype().size() <= 16 && caps::vector_size_for(client, x.dtype(), v) == v)
        .unwrap_or(1);
    let w_vectors = k_words / nw;
    let halves = if epilogue.gate.is_some() { 2 } else { 1 };
    let sms = caps::num_sms(client) as usize;
    let hw = &client.properties().hardware;
    let planes32 =
        caps::has_plane_ops(client) && hw.plane_size_min == 32 && hw.plane_size_max == 32;
    // Units per column: about four loads each at least, and more (up to one weight vector
    // each, two planes) until the grid has WARPS_PER_SM warps per SM. Measured on an H100 at
    // the 1.5B model's shapes, 8 lanes per column had run qkv and o on 4 warps per SM, the
    // gated MLP on 17 and down (32 lanes) on 12. Above 4 rows, one plane: there the reduction
    // is the larger cost and a plane's is one instruction per row (at M = 16: 21 µs with
    // planes, 43 with 8 lanes).
    let per_column = if m > 4 {
        32
    } else {
        let by_loads = 1usize << (w_vectors / 4).max(1).ilog2().clamp(2, 5);
        let by_warps = (WARPS_PER_SM * 32 * sms)
            .div_ceil(n * halves)
            .next_power_of_two()
            .min(1 << w_vectors.max(1).ilog2());
        let most = if planes32 { 64 } else { 32 };
        by_loads.max(by_warps).min(most)
    };
    let lanes = per_column.min(32) as u32;
    let splits = (per_column as u32).div_ceil(lanes);
    let use_plane = lanes == 32 && planes32;
    // Every vector of a unit in one pass where that is at most 12 loads, else passes of 12.
    let batch = w_vectors.div_ceil(per_column).clamp(1, MAX_LOADS / halves) as u32;
    // Cubes of about four staged x vectors per unit (64 units at K = 1536: the gated MLP's 8960
    // columns make 2240 cubes, spread evenly over the SMs, where 280 cubes of 256 units had left
    // a second partial wave), and fewer columns per cube where the columns would not give every
    // SM two cubes.
    let units = (k / nx / 4)
        .next_power_of_two()
        .clamp(64, CUBE_UNITS as usize) as u32;
    let mut cols = (units / per_column as u32).max(1);
    while cols > 1 && n.div_ceil(cols as usize) < 2 * sms {
        cols /= 2;
    }
    let plan = NkPlan {
        m: m as u32,
        lanes,
        splits,
        cols,
        use_plane,
        scale_per_vector: words_per_group.is_multiple_of(nw),
        epilogue: epilogue.blueprint(),
        norm: epilogue
            .norm
            .map(|_| ReducePlan::new(client, per_column as u32 * cols)),
        batch,
        stage: stage_chunks(client, m, k, nx),
        early_wait: caps::has_pdl(client),
        trigger: caps::has_launch_dependents(client),
    };
    let (bias, residual, norm_w, eps) = epilogue.operands(x);
    debug_assert!(matches!(x.dtype(), DType::F16 | DType::BF16 | DType::F32));
    let cubes = n.div_ceil(plan.cols as usize) as u32;
    let up_offset = if epilogue.gate.is_some() { n } else { 0 };
    unsafe {
        w4a16_gemv_nk_kernel::launch_unchecked::<R>(
            client,
            ops::launch::cube_count_1d(client, cubes),
            CubeDim::new_2d(plan.column_units(), plan.cols),
            nw,
            nx,
            x.as_buffer_arg(),
            qweight_nk.as_buffer_arg(),
            scales_nk.as_buffer_arg(),
            bias.as_buffer_arg(),
            residual.as_buffer_arg(),
            out.as_buffer_arg(),
            norm_w.as_buffer_arg(),
            n,
            k,
            w_vectors,
            words_per_group,
            k / group,
            up_offset,
            1.0 / k as f32,
            eps,
            plan,
            x.dtype().elem_type(),
        );
    }
    Ok(())
}

/// One unit per packed word: `w[col, 8 kw .. 8 kw + 8] = q · s` in the activation dtype, written
/// as `8 / NV` vectors.
#[cube(launch_unchecked)]
fn dequantize_nk_kernel<F: Float, NV: Size>(
    qweight: &[i32],
    scales: &[f32],
    out: &mut [Vector<F, NV>],
    words: usize,
    k_words: usize,
    words_per_group: usize,
    groups: usize,
    #[define(F)] _dtype: ElemType,
) {
    let w = CUBE_POS * CUBE_DIM as usize + UNIT_POS as usize;
    if w < words {
        let col = w / k_words;
        let kw = w % k_words;
        let s = scales[col * groups + kw / words_per_group];
        let word = qweight[w];
        let nv = out[0].vector_size();
        let per_word = comptime![8 / nv];
        #[unroll]
        for vi in 0..per_word {
            let mut v = Vector::<F, NV>::new(F::from_int(0));
            #[unroll]
            for l in 0..nv {
                v.insert(
                    l,
                    F::cast_from(nibble_exact(word, comptime![(vi * nv + l) as u32]) * s),
                );
            }
            out[w * per_word + vi] = v;
        }
    }
}

/// The layer's weight dequantized to a dense `[N, K]` matrix of `dtype` (bandwidth-bound: 0.5
/// byte read and 2 written per weight), for the dense GEMM at prefill sizes where the int4 GEMM
/// cannot run (`crate::w4a16_gemm::can_run`: other runtimes, K or groups not whole 32-k steps).
pub(crate) fn dequantize_nk<R: Runtime>(
    client: &ComputeClient<R>,
    qweight_nk: &DeviceTensor<R>,
    scales_nk: &DeviceTensor<R>,
    group: usize,
    [n, k]: [usize; 2],
    dtype: DType,
) -> DeviceTensor<R> {
    let out = DeviceTensor::empty(client, &[n, k], dtype);
    let words = n * k / 8;
    let nv = [8usize, 4, 2]
        .into_iter()
        .find(|&v| v * dtype.size() <= 16 && caps::vector_size_for(client, dtype, v) == v)
        .unwrap_or(1);
    unsafe {
        dequantize_nk_kernel::launch_unchecked::<R>(
            client,
            ops::launch::cube_count_1d(client, words.div_ceil(256) as u32),
            CubeDim::new_1d(256),
            nv,
            qweight_nk.as_buffer_arg(),
            scales_nk.as_buffer_arg(),
            out.as_buffer_arg(),
            words,
            k / 8,
            group / 8,
            k / group,
            dtype.elem_type(),
        );
    }
    out
}
