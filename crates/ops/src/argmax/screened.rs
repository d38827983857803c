//! Greedy decoding's argmax of the logits `y = x·wᵀ` without streaming all of `w`: the exact
//! answer from approximations of the logits and a bound on their error.
//!
//! A decode step's LM head is the largest product of a small model (the 1.5B Qwen2 shape's is 467
//! MB in bf16, 12% of a token's bytes), and greedy decoding keeps one number of it. Given
//! approximate logits `a` that a cheaper product computed (an 8-bit copy of the head reads half
//! the bytes) and per-row coefficients `c` with `|y_i - a_i| <= ‖x‖₂·c_i` (plus the rounding of
//! `a` to its dtype), every row whose upper bound falls below the best lower bound cannot be the
//! argmax. The rows left, usually a handful, are computed again from `w` with the arithmetic of
//! the CUDA-core GEMV ([`crate::matmul::linear`] at one row), so the id is the one
//! `argmax(linear(x, w))` gives, bit for bit, whatever the approximations were, as long as the
//! bound holds. A bound that holds for no row (NaN, infinities) keeps every row: slow, still exact.
//!
//! Three launches: the best lower bound (an atomic maximum over an order-preserving u32 key), the
//! rows that survive it computed again (each cube compacts its survivors in shared memory, then
//! its column groups take them in turns) with each cube's best in the scratch, and one cube that
//! picks among the cubes' bests, writes the id and leaves the scratch as it found it.
//!
//! Why the comparison is made in the logits' dtype: the argmax is over the logits as the GEMV
//! stores them, `Y_i = F(y_i)`, so two rows whose f32 values differ can tie after rounding, and
//! then the first index wins. Rounding is monotone, so `F(U_i) < F(T)` (`U_i` the row's upper
//! bound, `T` the best lower bound) proves `Y_i < Y_max`; a strict comparison in f32 would not.

use cubecl::prelude::*;

use super::{beats, best_of_slots, gather_row, store_best, write_slot, NextRow};
use crate::launch::{check_same_dtype, check_u32_ids};
use crate::matmul::{gemv_lanes, gemv_splits};
use crate::norm::sum_squares;
use crate::reduce::{cube_max, cube_sum, row_sum_shared_len, row_sum_split_in, ReducePlan};
use crate::{caps, DType, DeviceTensor, OpsError, Result};

/// Units per cube of every launch here (the rescoring cubes' column groups fill it as the
/// GEMV's do).
const CUBE: u32 = 256;

/// Rows each unit of the threshold launch bounds (loaded at once).
const THRESHOLD_LOADS: usize = 4;

/// The most blocks a rescoring cube screens (its survivor flags are tested in one unrolled
/// round of loads; more cubes take the rest).
const MAX_BLOCKS: usize = 4;

/// Absolute slack added to every bound: covers the f32 rounding of the bounds themselves near
/// zero and the subnormal rounding of f16 logits (2^-25).
const ABS_SLACK: f32 = 9.536_743e-7; // 2^-20

/// Relative slack on `|a_i|` for the rounding of the approximations to the logits' dtype (unit
/// roundoff 2^-9 in bf16, 2^-12 in f16) and of the bounds' own f32 arithmetic, with margin.
fn rel_slack(dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => 1.0 / 128.0,
        DType::F16 => 1.0 / 512.0,
        _ => 1.0 / 1_048_576.0,
    }
}

/// `‖x‖₂`'s factor of safety for its own f32 evaluation (a sum of K squares is off by at most
/// about K·2^-24 relative; 2^-10 covers K up to about 16k).
const NORM_SAFETY: f32 = 1.0 + 1.0 / 1024.0;

/// The comptime shape of the rescoring launch: the GEMV's column groups and how many blocks of
/// [`Self::units`] columns each cube screens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScreenPlan {
    /// Lanes of a plane-sized group and groups per column: the GEMV's at this shape.
    pub lanes: u32,
    pub splits: u32,
    pub use_plane: bool,
    /// Blocks of columns a rescoring cube screens, one column a unit.
    pub blocks: u32,
    /// Cubes of the rescoring launch.
    pub cubes: u32,
    /// Cubes of the threshold launch.
    pub threshold_cubes: u32,
    /// The rescoring cube's reductions.
    pub reduce: ReducePlan,
}

impl ScreenPlan {
    /// Column groups a rescoring cube holds (the GEMV's columns per cube).
    fn groups(&self) -> u32 {
        (CUBE / (self.lanes * self.splits)).max(1)
    }

    /// Units of a rescoring cube, and the columns of one of its blocks.
    pub fn units(&self) -> u32 {
        self.lanes * self.splits * self.groups()
    }

    /// The plan for `n` rows of `k_vectors` vectors on a device of `sms` SMs with the GEMV's
    /// `lanes` (and whether it reduces through planes); `reduce` must be for [`Self::units`] units (256 here).
    pub fn new(
        n: usize,
        k_vectors: usize,
        sms: u32,
        lanes: u32,
        use_plane: bool,
        reduce: ReducePlan,
    ) -> Self {
        let sms = sms.max(1) as usize;
        let mut plan = Self {
            reduce,
            lanes,
            splits: gemv_splits(sms as u32, n, k_vectors, lanes),
            use_plane,
            blocks: 1,
            cubes: 1,
            threshold_cubes: n.div_ceil(CUBE as usize * THRESHOLD_LOADS).max(1) as u32,
        };
        let units = plan.units() as usize;
        let blocks = n.div_ceil(2 * sms * units).clamp(1, MAX_BLOCKS);
        plan.blocks = blocks as u32;
        plan.cubes = n.div_ceil(blocks * units).max(1) as u32;
        plan
    }
}

/// Device memory of a screened argmax: the best lower bound's key (zero between launches),
/// `‖x‖₂`, a running count of the rows computed again, and a (value, index) candidate per
/// rescoring cube. Used by one stream at a time.
pub struct ScreenScratch<R: Runtime> {
    state: DeviceTensor<R>,
    partials: DeviceTensor<R>,
    n: usize,
}

impl<R: Runtime> ScreenScratch<R> {
    /// Scratch for the argmax of `n` logits on this device.
    pub fn new(client: &ComputeClient<R>, n: usize) -> Result<Self> {
        let plan = plan_for(client, n, 1);
        Ok(Self {
            state: DeviceTensor::from_slice(client, &[0u32, 0, 0], &[3])?,
            partials: DeviceTensor::empty(client, &[2 * plan.cubes as usize], DType::F32),
            n,
        })
    }

    /// The number of logits it was made for.
    pub fn logits(&self) -> usize {
        self.n
    }

    /// The rows the launches on this scratch have computed again from the float weights so
    /// far (the screen's survivors; modulo 2^32): how well the bounds screen, read back (a
    /// sync).
    pub fn rows_rescored(&self, client: &ComputeClient<R>) -> Result<u32> {
        Ok(self.state.to_vec::<u32>(client)?[2])
    }
}

/// The rows of a screened argmax: the logits `x·wᵀ` of one row `x[1, K]` against `w[V, K]`
/// (both of one float dtype, contiguous), their approximations `approx[1, V]` (that dtype) and
/// f32 coefficients `coef[V]` such that, for every row `i`, `|y_i - â_i| <= ‖x‖₂ · coef_i`,
/// where `y_i` is the f32 sum the CUDA-core GEMV computes for row `i` (before rounding to the
/// dtype) and `â_i` the approximation before it was rounded to the dtype (that rounding is
/// accounted for here). A coefficient too small makes the id wrong; one too large only slower.
pub struct Screened<'a, R: Runtime> {
    pub x: &'a DeviceTensor<R>,
    pub w: &'a DeviceTensor<R>,
    pub approx: &'a DeviceTensor<R>,
    pub coef: &'a DeviceTensor<R>,
}

impl<R: Runtime> Clone for Screened<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for Screened<'_, R> {}

/// The key of `v` in the order of f32 (larger key, larger value; -0 just below +0). Never 0
/// for a value that is not NaN, so 0 means "none yet".
#[cube]
fn order_key(v: f32) -> u32 {
    let b = u32::reinterpret(v);
    select(b >= 0x8000_0000u32, 0xFFFF_FFFFu32 - b, b | 0x8000_0000u32)
}

/// The value of an [`order_key`]; `f32::MIN` for 0 (no bound: every finite row survives).
#[cube]
fn from_order_key(k: u32) -> f32 {
    let b = select(k >= 0x8000_0000u32, k & 0x7FFF_FFFFu32, 0xFFFF_FFFFu32 - k);
    select(k == 0u32, f32::new(f32::MIN), f32::reinterpret(b))
}

/// How far row `i`'s logit may lie from its approximation `a`.
#[cube]
fn bound(a: f32, coef: f32, norm: f32, rel: f32) -> f32 {
    norm * coef + f32::abs(a) * rel + ABS_SLACK
}

/// The best lower bound of the logits over the cubes (an atomic maximum of its key in
/// `state[0]`), and `‖x‖₂` (with its safety factor) in `state[1]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn threshold_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    approx: &[F],
    coef: &[f32],
    state: &mut [Atomic<u32>],
    k_vectors: usize,
    rows: usize,
    rel: f32,
    #[comptime] reduce: ReducePlan,
    #[define(F)] _dtype: ElemType,
) {
    // Each unit's rows are loaded at once, ahead of the norm's reduction (one round of
    // latency, not one a row); a row past rows reads row rows - 1 again, harmlessly.
    let loads = comptime![THRESHOLD_LOADS];
    let first = CUBE_POS * CUBE_DIM as usize * loads + UNIT_POS as usize;
    let mut a = Array::<f32>::new(loads);
    let mut c = Array::<f32>::new(loads);
    #[unroll]
    for j in 0..loads {
        let i = min(first + j * CUBE_DIM as usize, rows - 1);
        a[j] = f32::cast_from(approx[i]);
        c[j] = coef[i];
    }
    let mut squares = 0f32;
    for kv in range_stepped(UNIT_POS as usize, k_vectors, CUBE_DIM as usize) {
        squares += sum_squares(x[kv]);
    }
    let norm = f32::sqrt(cube_sum(squares, reduce)) * NORM_SAFETY;
    let mut best = f32::new(f32::MIN);
    #[unroll]
    for j in 0..loads {
        let low = a[j] - bound(a[j], c[j], norm, rel);
        // NaN compares false: a row without a bound bounds nothing.
        if low > best {
            best = low;
        }
    }
    let best = cube_max(best, reduce);
    if UNIT_POS == 0 {
        state[0].fetch_max(order_key(best));
        if CUBE_POS == 0 {
            state[1].store(u32::reinterpret(norm));
        }
    }
}

/// Each cube's survivors of the threshold computed again from `w` as the GEMV computes them (and
/// counted in `state[2]`), and the cube's best (value, index) in `partials[2·cube ..]` (index
/// `rows` for none).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn rescore_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<F, N>],
    approx: &[F],
    coef: &[f32],
    state: &mut [Atomic<u32>],
    partials: &mut [f32],
    rows: usize,
    k_vectors: usize,
    rel: f32,
    #[comptime] plan: ScreenPlan,
    #[define(F)] _dtype: ElemType,
) {
    let threshold = f32::cast_from(F::cast_from(from_order_key(state[0].load())));
    let norm = f32::reinterpret(state[1].load());
    let blocks = comptime![plan.blocks as usize];
    let block = comptime![plan.units() as usize];
    let unit = UNIT_POS as usize;
    let base = CUBE_POS * blocks * block;
    // Every block's rows are tested before any is compacted: one round of loads, not one a block.
    let mut keep = Array::<u32>::new(blocks);
    #[unroll]
    for b in 0..blocks {
        let col = base + b * block + unit;
        let mut k = 0u32;
        if col < rows {
            let a = f32::cast_from(approx[col]);
            let up = a + bound(a, coef[col], norm, rel);
            // NaN (no bound) survives.
            let below = f32::cast_from(F::cast_from(up)) < threshold;
            k = select(below, 0u32, 1u32);
        }
        keep[b] = k;
    }
    // Most cubes have no survivor: one reduction tells, and they leave without the compaction.
    let mut flags = 0u32;
    #[unroll]
    for b in 0..blocks {
        flags += keep[b];
    }
    let survivors = cube_sum(f32::cast_from(flags), plan.reduce);
    if survivors > 0.0 {
        let mut list = Shared::<[u32]>::new_slice(comptime![(plan.blocks * plan.units()) as usize]);
        let mut scan = Shared::<[u32]>::new_slice(comptime![plan.units() as usize]);
        let mut count = 0u32;
        #[unroll]
        for b in 0..blocks {
            // An inclusive prefix sum of the survivors' flags (Hillis-Steele, portable).
            scan[unit] = keep[b];
            sync_cube();
            #[unroll]
            for step in 0..comptime![plan.units().trailing_zeros()] {
                let offset = comptime![1usize << step];
                let mut v = scan[unit];
                if unit >= offset {
                    v += scan[unit - offset];
                }
                sync_cube();
                scan[unit] = v;
                sync_cube();
            }
            if keep[b] == 1u32 {
                list[(count + scan[unit] - 1u32) as usize] = (base + b * block + unit) as u32;
            }
            count += scan[block - 1];
            // The last read of `scan` before the next block overwrites it.
            sync_cube();
        }
        if UNIT_POS == 0 {
            state[2].fetch_add(count);
        }

        let groups = comptime![plan.groups()];
        let group = UNIT_POS_Y;
        let lane = UNIT_POS_X as usize;
        let width = comptime![(plan.lanes * plan.splits) as usize];
        let none = rows as u32;
        let mut best = f32::new(f32::MIN);
        let mut best_i = none;
        let mut red = Shared::<[f32]>::new_slice(comptime![row_sum_shared_len(
            plan.lanes,
            plan.splits,
            plan.groups(),
            plan.use_plane
        )]);
        let rounds = count.div_ceil(groups);
        for r in 0..rounds {
            let at = r * groups + group;
            let valid = at < count;
            let col = select(valid, list[select(valid, at, 0u32) as usize], 0u32) as usize;
            let mut acc = 0f32;
            if valid {
                // The GEMV's sum for this column: the same lanes, vectors and order.
                let w_base = col * k_vectors;
                for kv in range_stepped(lane, k_vectors, width) {
                    acc += crate::matmul::gemv_dot(x[kv], w[w_base + kv]);
                }
            }
            let total = row_sum_split_in(acc, &mut red, plan.lanes, plan.splits, plan.use_plane);
            if valid && lane == 0 {
                let v = f32::cast_from(F::cast_from(total));
                if beats(v, col as u32, best, best_i) {
                    best = v;
                    best_i = col as u32;
                }
            }
        }
        let mut vals = Shared::<[f32]>::new_slice(comptime![plan.groups() as usize]);
        let mut idxs = Shared::<[u32]>::new_slice(comptime![plan.groups() as usize]);
        if lane == 0 {
            vals[group as usize] = best;
            idxs[group as usize] = best_i;
        }
        sync_cube();
        if UNIT_POS == 0 {
            store_best(
                &vals,
                &idxs,
                partials,
                CUBE_POS,
                comptime![plan.groups() as usize],
            );
        }
    } else if UNIT_POS == 0 {
        let slot = CUBE_POS * 2;
        partials[slot] = f32::new(f32::MIN);
        partials[slot + 1] = f32::reinterpret(rows as u32);
    }
}

/// The best of the rescoring cubes' candidates into `out[0]` (0 where there is none: every
/// logit NaN), the threshold's key back to zero, and with `advance` / `gather` the advancing
/// argmax's counters, slot and next row ([`super::argmax_split_advance_into`]).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn finish_kernel<F: Float, N: Size>(
    partials: &[f32],
    state: &mut [Atomic<u32>],
    out: &mut [u32],
    first_counter: &mut [u32],
    second_counter: &mut [u32],
    even_slot: &mut [u32],
    odd_slot: &mut [u32],
    table: &[Vector<F, N>],
    next_row: &mut [Vector<F, N>],
    cubes: usize,
    rows: usize,
    row_vectors_out: usize,
    #[comptime] advance: bool,
    #[comptime] gather: bool,
    #[define(F)] _dtype: ElemType,
) {
    let none = rows as u32;
    let unit = UNIT_POS as usize;
    let (best, best_i) = best_of_slots(partials, 0, unit, cubes, CUBE_DIM as usize, none);
    let mut vals = Shared::<[f32]>::new_slice(comptime![CUBE as usize]);
    let mut idxs = Shared::<[u32]>::new_slice(comptime![CUBE as usize]);
    vals[unit] = best;
    idxs[unit] = best_i;
    sync_cube();
    #[unroll]
    for step in 0..comptime![CUBE.trailing_zeros()] {
        let stride = comptime![(CUBE >> (step + 1)) as usize];
        if unit < stride {
            let (v, i) = (vals[unit + stride], idxs[unit + stride]);
            if beats(v, i, vals[unit], idxs[unit]) {
                vals[unit] = v;
                idxs[unit] = i;
            }
        }
        sync_cube();
    }
    if unit == 0 {
        let id = select(idxs[0] == none, 0u32, idxs[0]);
        out[0] = id;
        state[0].store(0u32);
        if comptime![advance] {
            let second = second_counter[0];
            first_counter[0] += 1u32;
            second_counter[0] = second + 1u32;
            write_slot(even_slot, odd_slot, second, id);
        }
        idxs[0] = id;
    }
    if comptime![gather] {
        sync_cube();
        gather_row(table, next_row, idxs[0] as usize, row_vectors_out);
    }
}

/// The plan of `n` logits over `k_vectors` vectors of inputs on this device.
fn plan_for<R: Runtime>(client: &ComputeClient<R>, n: usize, k_vectors: usize) -> ScreenPlan {
    let (lanes, use_plane) = gemv_lanes(client);
    let reduce = ReducePlan::new(client, CUBE);
    let mut plan = ScreenPlan::new(
        n,
        k_vectors,
        caps::num_sms(client),
        lanes,
        use_plane,
        reduce,
    );
    // A cube of more units (planes of 64 lanes, 8 a column) reduces over all of them.
    plan.reduce = ReducePlan::new(client, plan.units());
    plan
}

fn validate<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    s: Screened<'_, R>,
    out: &DeviceTensor<R>,
    scratch: &ScreenScratch<R>,
) -> Result<Validated> {
    caps::check_float_dtype(client, op, s.x.dtype())?;
    let (n, k) = match s.w.shape() {
        [n, k] => (*n, *k),
        other => {
            return Err(OpsError::shape(
                op,
                format!("w must be [V, K], got {other:?}"),
            ))
        }
    };
    if n == 0 || k == 0 || n > u32::MAX as usize - 1 {
        return Err(OpsError::shape(
            op,
            format!("w {:?} is empty or too large", s.w.shape()),
        ));
    }
    if s.x.numel() != k || s.x.shape().iter().rev().skip(1).any(|&d| d != 1) {
        return Err(OpsError::shape(
            op,
            format!(
                "x must be one row of {k} (w {:?}), got {:?}",
                s.w.shape(),
                s.x.shape()
            ),
        ));
    }
    if s.approx.numel() != n || s.approx.last_dim() != n {
        return Err(OpsError::shape(
            op,
            format!(
                "approx must be one row of {n} logits, got {:?}",
                s.approx.shape()
            ),
        ));
    }
    check_same_dtype(op, s.x, s.w)?;
    check_same_dtype(op, s.x, s.approx)?;
    if s.coef.dtype() != DType::F32 || s.coef.numel() != n {
        return Err(OpsError::shape(
            op,
            format!(
                "coef must be {n} f32 values, got {:?} {}",
                s.coef.shape(),
                s.coef.dtype()
            ),
        ));
    }
    for t in [s.x, s.w, s.approx, s.coef] {
        if !t.is_contiguous() {
            return Err(OpsError::shape(op, "every operand must be contiguous"));
        }
    }
    check_u32_ids(op, "out", out, 1)?;
    let vector = caps::vector_size_for(client, s.x.dtype(), k);
    let plan = plan_for(client, n, k / vector);
    if scratch.n != n || scratch.partials.numel() < 2 * plan.cubes as usize {
        return Err(OpsError::shape(
            op,
            format!("the scratch is for {} logits, not {n}", scratch.n),
        ));
    }
    Ok(Validated {
        n,
        vector,
        k_vectors: k / vector,
        plan,
    })
}

/// A validated screened argmax: its logits, the vector width and count of a row of `w`, and
/// the launch plan.
struct Validated {
    n: usize,
    vector: usize,
    k_vectors: usize,
    plan: ScreenPlan,
}

/// `argmax(linear(x, w))` of one row into `out[0]` (u32 `[1]`) from the approximations and
/// bounds of `s` ([`Screened`]): the first index on ties, NaN never chosen (0 for a row of only
/// NaN), as [`super::argmax`]. `scratch` ([`ScreenScratch::new`] for V logits of K inputs) is
/// left as found.
pub fn screened_argmax_into<R: Runtime>(
    client: &ComputeClient<R>,
    s: Screened<'_, R>,
    out: &DeviceTensor<R>,
    scratch: &ScreenScratch<R>,
) -> Result<()> {
    launch(client, s, out, scratch, None)
}

/// [`screened_argmax_into`] that then advances two counters, writes the id to the slot of the
/// second counter's parity and, with `next_row`, gathers the id's embedding row, as
/// [`super::argmax_split_advance_into`] does.
pub fn screened_argmax_advance_into<R: Runtime>(
    client: &ComputeClient<R>,
    s: Screened<'_, R>,
    out: &DeviceTensor<R>,
    scratch: &ScreenScratch<R>,
    counters: [&DeviceTensor<R>; 2],
    slots: [&DeviceTensor<R>; 2],
    next_row: Option<NextRow<'_, R>>,
) -> Result<()> {
    let advance = (counters, slots, next_row);
    super::check_advance("screened argmax advance", &advance, s.approx)?;
    launch(client, s, out, scratch, Some(advance))
}

fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    s: Screened<'_, R>,
    out: &DeviceTensor<R>,
    scratch: &ScreenScratch<R>,
    advance: Option<super::Advance<'_, R>>,
) -> Result<()> {
    const OP: &str = "screened argmax";
    let Validated {
        n,
        vector,
        k_vectors,
        plan,
    } = validate(client, OP, s, out, scratch)?;
    let dtype = s.x.dtype();
    let rel = rel_slack(dtype);
    let elem = dtype.elem_type();
    // SAFETY: shapes validated above; the threshold kernel reads x (k_vectors vectors), approx
    // and coef (n each) and updates the scratch's first two words.
    unsafe {
        threshold_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(plan.threshold_cubes, 1, 1),
            CubeDim::new_1d(CUBE),
            vector,
            s.x.as_buffer_arg(),
            s.approx.as_buffer_arg(),
            s.coef.as_buffer_arg(),
            scratch.state.as_buffer_arg(),
            k_vectors,
            n,
            rel,
            ReducePlan::new(client, CUBE),
            elem,
        );
    }
    // SAFETY: each cube reads rows below n of approx, coef and w (n x k_vectors vectors) and
    // writes its two partials (the scratch holds 2 x cubes).
    unsafe {
        rescore_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(plan.cubes, 1, 1),
            CubeDim::new_2d(plan.lanes * plan.splits, plan.groups()),
            vector,
            s.x.as_buffer_arg(),
            s.w.as_buffer_arg(),
            s.approx.as_buffer_arg(),
            s.coef.as_buffer_arg(),
            scratch.state.as_buffer_arg(),
            scratch.partials.as_buffer_arg(),
            n,
            k_vectors,
            rel,
            plan,
            elem,
        );
    }
    let next_row = advance.and_then(|(_, _, next)| next);
    let ([first, second], [even, odd]) =
        advance.map_or(([out, out], [out, out]), |(c, s, _)| (c, s));
    // Without a row to gather, the table and row arguments are bound to approx (never read).
    let (table, row) = next_row.map_or((s.approx, s.approx), |next| (next.table, next.row));
    let gather_vector = next_row.map_or(1, |next| {
        caps::vector_size_for(client, dtype, next.table.shape()[1])
    });
    let row_vectors_out = next_row.map_or(0, |next| next.table.shape()[1] / gather_vector);
    // SAFETY: one cube reads the `cubes` candidates, writes out[0], resets the scratch's key,
    // with `advance` element 0 of four u32[1] tensors, and with a row to gather (validated: the
    // table has a row for every id below n, the row its width) copies that row.
    unsafe {
        finish_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(CUBE),
            gather_vector,
            scratch.partials.as_buffer_arg(),
            scratch.state.as_buffer_arg(),
            out.as_buffer_arg(),
            first.as_buffer_arg(),
            second.as_buffer_arg(),
            even.as_buffer_arg(),
            odd.as_buffer_arg(),
            table.as_buffer_arg(),
            row.as_buffer_arg(),
            plan.cubes as usize,
            n,
            row_vectors_out,
            advance.is_some(),
            next_row.is_some(),
            elem,
        );
    }
    Ok(())
}

#[cfg(test)]
mod cuda_source;
