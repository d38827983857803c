//! Argmax over the last dimension (greedy decoding reads one u32 per step instead of the
//! vocabulary's logits).

use cubecl::prelude::*;

use crate::gemm::{last_to_finish, SplitNeed, SplitScratch};
use crate::launch::{check_same_dtype, check_u32_ids, cube_count_1d, validate_rows};
use crate::{caps, DType, DeviceTensor, OpsError, Result};

/// Units per cube: one cube per row, a shared-memory tree over the units' candidates.
const CUBE: u32 = 512;
/// Loads each unit has in flight.
const UNROLL: usize = 8;

#[cube(launch_unchecked)]
fn argmax_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    out: &mut [u32],
    rows: usize,
    n_cols: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS;
    if row >= rows {
        terminate!();
    }
    let row_vectors = n_cols / x[0].vector_size();
    let base = row * row_vectors;
    let mut best = f32::new(f32::MIN);
    let mut best_i = n_cols;
    // Each unit scans increasing indices, so a strict `>` keeps the first of equal values;
    // NaN compares false and is never chosen. The row is one SM's work (a vocabulary of 152k
    // logits is 300 KB in bf16), so the scan is latency-bound: each unit issues `UNROLL` wide
    // loads before comparing any (one dependent load per iteration took 14 µs on an H100).
    let stride = CUBE_DIM as usize;
    let last = row_vectors - 1;
    for i0 in range_stepped(UNIT_POS as usize, row_vectors, stride * UNROLL) {
        let mut batch = Array::<Vector<F, N>>::new(UNROLL);
        #[unroll]
        for u in 0..UNROLL {
            batch[u] = x[base + min(i0 + u * stride, last)];
        }
        #[unroll]
        for u in 0..UNROLL {
            let i = i0 + u * stride;
            if i < row_vectors {
                let v = batch[u];
                #[unroll]
                for k in 0..v.vector_size() {
                    let e = f32::cast_from(v.extract(k));
                    if e > best || (best_i == n_cols && e == best) {
                        best = e;
                        best_i = i * v.vector_size() + k;
                    }
                }
            }
        }
    }
    let mut vals = Shared::<[f32]>::new_slice(comptime![CUBE as usize]);
    let mut idxs = Shared::<[usize]>::new_slice(comptime![CUBE as usize]);
    vals[UNIT_POS as usize] = best;
    idxs[UNIT_POS as usize] = best_i;
    sync_cube();
    #[unroll]
    for step in 0..comptime![CUBE.trailing_zeros()] {
        let stride = comptime![(CUBE >> (step + 1)) as usize];
        let u = UNIT_POS as usize;
        if u < stride {
            let (v, i) = (vals[u + stride], idxs[u + stride]);
            let (bv, bi) = (vals[u], idxs[u]);
            // Larger value wins; on a tie (or an empty side) the smaller index.
            if v > bv || (v == bv && i < bi) || (bi == n_cols && i < n_cols) {
                vals[u] = v;
                idxs[u] = i;
            }
        }
        sync_cube();
    }
    if UNIT_POS == 0 {
        // A row of only NaN has no candidate: report index 0.
        let i = idxs[0];
        out[row] = select(i == n_cols, 0u32, i as u32);
    }
}

/// Index of the largest element of each row of `x[.., n]` as u32 `[..]` (the shape without the
/// last dim; a 1-D input gives `[1]`). First index on ties; NaN is never chosen (a row of only
/// NaN gives 0).
pub fn argmax<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
) -> Result<DeviceTensor<R>> {
    let mut shape = x.shape()[..x.rank().saturating_sub(1)].to_vec();
    if shape.is_empty() {
        shape.push(1);
    }
    let out = DeviceTensor::empty(client, &shape, DType::U32);
    argmax_into(client, x, &out)?;
    Ok(out)
}

/// [`argmax`] into a preallocated u32 tensor with one element per row.
pub fn argmax_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "argmax";
    validate_rows(client, OP, x, &[])?;
    check_u32_ids(OP, "out", out, x.rows())?;
    let vector = caps::vector_size_for(client, x.dtype(), x.last_dim());
    unsafe {
        argmax_kernel::launch_unchecked::<R>(
            client,
            cube_count_1d(client, x.rows() as u32),
            CubeDim::new_1d(CUBE),
            vector,
            x.as_buffer_arg(),
            out.as_buffer_arg(),
            x.rows(),
            x.last_dim(),
            x.dtype().elem_type(),
        );
    }
    Ok(())
}

/// Units per cube of the split argmax.
const SPLIT_CUBE: u32 = 256;
/// Vector loads each unit of the split argmax issues at once (at least; more where the row
/// would otherwise need more cubes than the GPU has SMs).
const SPLIT_LOADS: usize = 4;

/// How a row is split across cubes: `splits` cubes of [`SPLIT_CUBE`] units, `loads` vectors per
/// unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SplitShape {
    splits: u32,
    loads: usize,
}

impl SplitShape {
    fn new(row_vectors: usize, sms: usize) -> Self {
        let per_round = SPLIT_CUBE as usize;
        let loads = row_vectors
            .div_ceil(per_round * sms.max(1))
            .max(SPLIT_LOADS);
        Self {
            splits: row_vectors.div_ceil(per_round * loads).max(1) as u32,
            loads,
        }
    }

    /// The scratch `rows` rows take: a (value, index) candidate per cube, a counter per row.
    fn need(&self, rows: usize) -> SplitNeed {
        SplitNeed {
            partials: rows * self.splits as usize * 2,
            counters: rows,
        }
    }
}

/// Whether `a` (value, index) beats `b`: the larger value, on a tie the smaller index (an index
/// of `none` is no candidate and loses every tie). NaN compares false and never wins.
#[cube]
fn beats(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    av > bv || (av == bv && ai < bi)
}

/// The best (value, index) of a plane's lanes, returned to every lane.
#[cube]
fn plane_best(v: f32, i: u32) -> (f32, u32) {
    let mut bv = v;
    let mut bi = i;
    #[unroll]
    for step in 0..5u32 {
        let ov = plane_shuffle_xor(bv, comptime![1u32 << step]);
        let oi = plane_shuffle_xor(bi, comptime![1u32 << step]);
        if beats(ov, oi, bv, bi) {
            bv = ov;
            bi = oi;
        }
    }
    (bv, bi)
}

/// The best of `count` (value, index) candidates staged in shared memory (one per plane or
/// column group), read by one unit, into slot `slot` of `partials` (value, then index bits).
#[cube]
fn store_best(
    vals: &[f32],
    idxs: &[u32],
    partials: &mut [f32],
    slot: usize,
    #[comptime] count: usize,
) {
    let mut cv = vals[0];
    let mut ci = idxs[0];
    #[unroll]
    for p in 1..count {
        if beats(vals[p], idxs[p], cv, ci) {
            cv = vals[p];
            ci = idxs[p];
        }
    }
    partials[slot * 2] = cv;
    partials[slot * 2 + 1] = f32::reinterpret(ci);
}

/// The best of the candidates in slots `base + s` of `partials`, `s` from `first` below `count`
/// by `step` (`none`: no candidate).
#[cube]
fn best_of_slots(
    partials: &[f32],
    base: usize,
    first: usize,
    count: usize,
    step: usize,
    none: u32,
) -> (f32, u32) {
    let mut cv = f32::new(f32::MIN);
    let mut ci = none;
    for s in range_stepped(first, count, step) {
        let slot = base + s;
        let v = partials[slot * 2];
        let i = u32::reinterpret(partials[slot * 2 + 1]);
        if beats(v, i, cv, ci) {
            cv = v;
            ci = i;
        }
    }
    (cv, ci)
}

/// `next_row = table[id]` (rows of `row_vectors` vectors), by the whole cube.
#[cube]
fn gather_row<F: Float, N: Size>(
    table: &[Vector<F, N>],
    next_row: &mut [Vector<F, N>],
    id: usize,
    row_vectors: usize,
) {
    for i in range_stepped(UNIT_POS as usize, row_vectors, CUBE_DIM as usize) {
        next_row[i] = table[id * row_vectors + i];
    }
}

/// Argmax with each row split over `shape.splits` cubes (CUDA: 32-unit planes and a device-scope
/// fence): every cube reduces its slice to one (value, index) candidate in slot `row · splits +
/// split` of `partials`, and the last cube of the row to finish ([`last_to_finish`]) reduces
/// the row's candidates. The winner does not depend on the order the cubes finish in: the
/// comparison (larger value, then smaller index) is a total order on the candidates.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn argmax_split_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    partials: &mut [f32],
    counters: &[Atomic<u32>],
    out: &mut [u32],
    first_counter: &mut [u32],
    second_counter: &mut [u32],
    even_slot: &mut [u32],
    odd_slot: &mut [u32],
    table: &[Vector<F, N>],
    next_row: &mut [Vector<F, N>],
    n_cols: usize,
    row_vectors_out: usize,
    #[comptime] shape: SplitShape,
    #[comptime] advance: bool,
    #[comptime] gather: bool,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS_Y as usize;
    let split = CUBE_POS_X as usize;
    let splits = comptime![shape.splits as usize];
    let loads = comptime![shape.loads];
    let none = n_cols as u32;
    let row_vectors = n_cols / x[0].vector_size();
    let last = row_vectors - 1;
    let first = split * loads * CUBE_DIM as usize + UNIT_POS as usize;
    let base = row * row_vectors;
    let mut batch = Array::<Vector<F, N>>::new(loads);
    #[unroll]
    for u in 0..loads {
        batch[u] = x[base + min(first + u * CUBE_DIM as usize, last)];
    }
    let mut best = f32::new(f32::MIN);
    let mut best_i = none;
    #[unroll]
    for u in 0..loads {
        let i = first + u * CUBE_DIM as usize;
        if i < row_vectors {
            let v = batch[u];
            #[unroll]
            for k in 0..v.vector_size() {
                let e = f32::cast_from(v.extract(k));
                let idx = (i * v.vector_size() + k) as u32;
                if beats(e, idx, best, best_i) {
                    best = e;
                    best_i = idx;
                }
            }
        }
    }
    let (pv, pi) = plane_best(best, best_i);
    let mut vals = Shared::<[f32]>::new_slice(comptime![(SPLIT_CUBE / 32) as usize]);
    let mut idxs = Shared::<[u32]>::new_slice(comptime![(SPLIT_CUBE / 32) as usize]);
    let plane = UNIT_POS as usize / 32;
    let lane = UNIT_POS as usize % 32;
    if lane == 0 {
        vals[plane] = pv;
        idxs[plane] = pi;
    }
    sync_cube();
    if UNIT_POS == 0 {
        let planes = comptime![(SPLIT_CUBE / 32) as usize];
        store_best(&vals, &idxs, partials, row * splits + split, planes);
    }
    // Uniform across the cube (the flag is shared), so the last cube may synchronise below.
    if last_to_finish(counters, row, comptime![shape.splits]) {
        if plane == 0 {
            // The counters do not depend on the winner: their loads go out with the partials'.
            let mut first = 0u32;
            let mut second = 0u32;
            if comptime![advance] {
                first = first_counter[0];
                second = second_counter[0];
            }
            let (cv, ci) = best_of_slots(&*partials, row * splits, lane, splits, 32usize, none);
            let (_, wi) = plane_best(cv, ci);
            if lane == 0 {
                // A row of only NaN has no candidate: report index 0.
                let id = select(wi == none, 0u32, wi);
                out[row] = id;
                idxs[0] = id;
                if comptime![advance] {
                    // One row (checked at launch), so this unit runs once per launch.
                    first_counter[0] = first + 1u32;
                    second_counter[0] = second + 1u32;
                    write_slot(even_slot, odd_slot, second, id);
                }
            }
        }
        if comptime![gather] {
            // The next step's input row, by the whole cube: one load a unit at the 1.5B
            // model's 192 vectors, instead of a kernel of its own at the next step's start.
            sync_cube();
            gather_row(table, next_row, idxs[0] as usize, row_vectors_out);
        }
    }
}

/// The id into `even_slot` or `odd_slot` by the parity of `second`, the second counter's value
/// before its advance: consecutive launches alternate between the slots.
#[cube]
fn write_slot(even_slot: &mut [u32], odd_slot: &mut [u32], second: u32, id: u32) {
    if second & 1 == 0 {
        even_slot[0] = id;
    } else {
        odd_slot[0] = id;
    }
}

/// Adds one to each of two `u32[1]` counters and writes the id in `ids[0]` to the slot of the
/// second counter's parity (one unit).
#[cube(launch_unchecked)]
fn advance_kernel(
    ids: &[u32],
    first_counter: &mut [u32],
    second_counter: &mut [u32],
    even_slot: &mut [u32],
    odd_slot: &mut [u32],
) {
    if ABSOLUTE_POS == 0 {
        let second = second_counter[0];
        first_counter[0] += 1u32;
        second_counter[0] = second + 1u32;
        write_slot(even_slot, odd_slot, second, ids[0]);
    }
}

/// Whether [`argmax_split_into`] splits rows across cubes here (CUDA, 32-unit planes).
fn splits_rows<R: Runtime>(client: &ComputeClient<R>) -> bool {
    caps::runtime_name(client).contains("cuda")
        && caps::has_plane_ops(client)
        && caps::plane_size_min(client) == 32
}

/// The split of rows of `n` elements of `dtype`, and the vector width it loads (none where
/// one cube per row runs).
fn split_shape<R: Runtime>(
    client: &ComputeClient<R>,
    n: usize,
    width: usize,
    dtype: DType,
) -> Option<(SplitShape, usize)> {
    if !splits_rows(client) || n == 0 {
        return None;
    }
    // A width that `width` (a divisor of n) allows.
    let vector = caps::vector_size_for(client, dtype, width);
    Some((
        SplitShape::new(n / vector, caps::num_sms(client) as usize),
        vector,
    ))
}

/// What [`argmax_split_into`] needs of a [`SplitScratch`] for `rows` rows of `n` elements of
/// `dtype` (nothing where it runs one cube per row).
pub fn split_need<R: Runtime>(
    client: &ComputeClient<R>,
    rows: usize,
    n: usize,
    dtype: DType,
) -> SplitNeed {
    split_shape(client, n, n, dtype).map_or(SplitNeed::default(), |(shape, _)| shape.need(rows))
}

/// [`argmax_into`] with each row split across cubes where the runtime allows it (CUDA) and
/// `scratch` holds [`split_need`]: a row of a large vocabulary (152k logits) is then read by
/// many SMs at once instead of one, and the last cube of the row to finish picks among the
/// cubes' candidates. The result is the same as [`argmax_into`]'s (first index on ties, NaN
/// never chosen). `scratch` is used by one stream at a time and left as it was found (its
/// counters at zero); without room in it, one cube per row runs.
pub fn argmax_split_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    scratch: &SplitScratch<R>,
) -> Result<()> {
    split_launch(client, x, out, scratch, None)
}

/// [`argmax_split_into`] of one row that then adds one to each of two distinct `u32[1]`
/// counters, once the id is written: a decode step's positions (the first appended row and the
/// length after it) advanced for the next step on the device, so that replays of a captured
/// step need no host write of them in between. The id also goes to `slots[c % 2]` (two distinct
/// `u32[1]`), `c` being the second counter's value before the advance: the host can read the id
/// of one launch from its slot while the next launch, already queued, writes the other one.
/// Where the row is split, the unit that writes the id does all of it (after every earlier
/// kernel on the stream ended); elsewhere a one-unit kernel follows the argmax.
///
/// With `next_row`, the chosen id's row of an embedding table is also copied into a row
/// ([`NextRow`]): the input of a decode step fed by this choice, gathered here instead of by an
/// embedding kernel at that step's start.
pub fn argmax_split_advance_into<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    scratch: &SplitScratch<R>,
    counters: [&DeviceTensor<R>; 2],
    slots: [&DeviceTensor<R>; 2],
    next_row: Option<NextRow<'_, R>>,
) -> Result<()> {
    const OP: &str = "argmax advance";
    if x.rows() != 1 {
        return Err(OpsError::shape(
            OP,
            format!(
                "the counters advance once per launch: one row, not {}",
                x.rows()
            ),
        ));
    }
    let advance = (counters, slots, next_row);
    check_advance(OP, &advance, x)?;
    split_launch(client, x, out, scratch, Some(advance))
}

/// Checks what an advancing argmax over `logits` writes besides the id: two `u32[1]` counters,
/// two `u32[1]` slots and the row it gathers, if any ([`NextRow`]).
fn check_advance<R: Runtime>(
    op: &'static str,
    (counters, slots, next_row): &Advance<'_, R>,
    logits: &DeviceTensor<R>,
) -> Result<()> {
    let named = ["first counter", "second counter", "even slot", "odd slot"];
    let all = [counters[0], counters[1], slots[0], slots[1]];
    for (name, c) in named.into_iter().zip(all) {
        check_u32_ids(op, name, c, 1)?;
    }
    if let Some(next) = next_row {
        next.validate(op, logits)?;
    }
    Ok(())
}

/// The embedding row an advancing argmax gathers for the step its id feeds: `row[0..H] =
/// table[id]`, `table` a contiguous `[V, H]` table of the logits' dtype with at least as many
/// rows as the logits have columns (so that every id has one), `row` a contiguous tensor of `H`
/// elements of that dtype.
pub struct NextRow<'a, R: Runtime> {
    pub table: &'a DeviceTensor<R>,
    pub row: &'a DeviceTensor<R>,
}

// Two shared references: copyable whatever `R` is (a derive would ask `R: Copy`).
impl<R: Runtime> Clone for NextRow<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for NextRow<'_, R> {}

impl<R: Runtime> NextRow<'_, R> {
    fn validate(&self, op: &'static str, logits: &DeviceTensor<R>) -> Result<()> {
        check_same_dtype(op, logits, self.table)?;
        crate::embedding::check_gather(op, self.table, 1, self.row)?;
        if self.table.shape()[0] < logits.last_dim() {
            return Err(OpsError::shape(
                op,
                format!(
                    "the embedding table {:?} has fewer rows than the {} logits",
                    self.table.shape(),
                    logits.last_dim()
                ),
            ));
        }
        Ok(())
    }

    /// The row's width.
    fn hidden(&self) -> usize {
        self.table.shape()[1]
    }
}

/// The two counters an advancing argmax adds one to, its two parity slots and the row it
/// gathers, if any.
type Advance<'a, R> = (
    [&'a DeviceTensor<R>; 2],
    [&'a DeviceTensor<R>; 2],
    Option<NextRow<'a, R>>,
);

fn split_launch<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    scratch: &SplitScratch<R>,
    advance: Option<Advance<'_, R>>,
) -> Result<()> {
    const OP: &str = "argmax";
    validate_rows(client, OP, x, &[])?;
    check_u32_ids(OP, "out", out, x.rows())?;
    let (rows, n) = (x.rows(), x.last_dim());
    let next_row = advance.and_then(|(_, _, next)| next);
    // The logits' and the gathered row's vectors are one width: one that divides both.
    let width = next_row.map_or(n, |next| gcd(n, next.hidden()));
    let split = split_shape(client, n, width, x.dtype())
        .filter(|(shape, _)| scratch.fits(shape.need(rows)) && rows <= u16::MAX as usize);
    let Some((shape, vector)) = split else {
        argmax_into(client, x, out)?;
        if let Some(([first, second], [even, odd], _)) = advance {
            // SAFETY: one unit reads `out[0]` and writes element 0 of four u32[1] tensors
            // (checked by the caller).
            unsafe {
                advance_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(1, 1, 1),
                    CubeDim::new_1d(1),
                    out.as_buffer_arg(),
                    first.as_buffer_arg(),
                    second.as_buffer_arg(),
                    even.as_buffer_arg(),
                    odd.as_buffer_arg(),
                );
            }
        }
        if let Some(next) = next_row {
            crate::embedding::embedding_into(client, next.table, out, next.row)?;
        }
        return Ok(());
    };
    // Without counters the kernel's counter and slot arguments are `out`, and without a row to
    // gather its table and row are `x`: it then never touches them.
    let ([first, second], [even, odd]) =
        advance.map_or(([out, out], [out, out]), |(c, s, _)| (c, s));
    let (table, next) = next_row.map_or((x, x), |next| (next.table, next.row));
    let row_vectors_out = next_row.map_or(0, |next| next.hidden() / vector);
    // SAFETY: the kernel reads `rows x n` of x, writes `rows` ids and the split's partials in
    // the scratch (they fit), leaves the `rows` counters it uses at zero and, with `advance`
    // (one row), adds one to element 0 of each u32[1] counter and writes element 0 of one slot;
    // with a row to gather (validated: the table has a row for every id below `n`, the row its
    // width, both divided by `vector`) it copies that row.
    unsafe {
        argmax_split_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(shape.splits, rows as u32, 1),
            CubeDim::new_1d(SPLIT_CUBE),
            vector,
            x.as_buffer_arg(),
            scratch.partials_arg(),
            scratch.counters_arg(),
            out.as_buffer_arg(),
            first.as_buffer_arg(),
            second.as_buffer_arg(),
            even.as_buffer_arg(),
            odd.as_buffer_arg(),
            table.as_buffer_arg(),
            next.as_buffer_arg(),
            n,
            row_vectors_out,
            shape,
            advance.is_some(),
            next_row.is_some(),
            x.dtype().elem_type(),
        );
    }
    Ok(())
}

/// The greatest common divisor of `a` and `b`.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod cuda_source;
pub mod screened;
