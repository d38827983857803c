//! The sampler's small-top-k plan: two launches instead of the radix searches over the whole
//! vocabulary.
//!
//! The top-k set under the total order (key, id) is a subset of the union of every chunk's own
//! top-k set under that order. So `local_top_kernel` keys `LOCAL_CHUNK` ids per cube (the
//! penalty and the mark as `prepare` applies them), selects the cube's top-k by a radix search
//! in shared memory and writes them, in id order, to the cube's `stride` candidate slots (the
//! rest `EXCLUDED`), with the cube's k-th key. `final_draw_kernel` (one cube per row) holds
//! every slot in registers, finds the row's maximum and its top-k set among the candidates no
//! larger than the smallest of the cubes' k-th keys (no key above it can be among the k
//! smallest), gathers that set (at most `MAX_K`, one per unit), orders it by value for top-p
//! and draws from it in id order. The slots are stored transposed so that the final cube's
//! loads are coalesced, and where few candidates survive the bound they move to shared memory,
//! a few per unit, for the searches.
//!
//! Every mass is the fixed-point mass of the radix plan (the same keys, maximum and scale) and
//! every sum an integer sum, so both plans keep the same set and draw the same token.

use cubecl::prelude::*;

use super::fixed::*;
use super::kernels::{
    marked_id, penalised_key, top_p_target, BINS, BITS, CUBE, PARAM_WORDS, PASSES, P_PENALTY,
    P_TEMPERATURE, P_TOP_K, P_TOP_P,
};

/// Ids per unit of `local_top_kernel`, consecutive.
pub(crate) const LOCAL_PER: u32 = 8;
/// Ids per cube of `local_top_kernel`.
pub(crate) const LOCAL_CHUNK: u32 = CUBE * LOCAL_PER;
/// Candidate slots per unit of `final_draw_kernel`, held in registers.
pub(crate) const FINAL_PER: u32 = 32;
/// Candidate slots per row.
pub(crate) const SLOTS: u32 = CUBE * FINAL_PER;
/// The largest top-k of the plan: the final kernel orders the set with one element per unit.
pub(crate) const MAX_K: u32 = CUBE;
/// Candidates the final kernel moves to shared memory when no more survive the bound, and
/// how many each unit then holds.
const SURVIVOR_PER: u32 = 4;
const SURVIVORS: u32 = CUBE * SURVIVOR_PER;
/// Units per plane where the kernels use plane operations (`planes`).
pub(crate) const PLANE: u32 = 32;
const PLANES: u32 = CUBE / PLANE;

/// The cube's shared scratch: the scans' and minima's words.
#[derive(CubeType)]
struct Scratch {
    sa: Shared<[u32]>,
    sb: Shared<[u32]>,
    sc: Shared<[u32]>,
    /// Each plane's totals (three words per plane).
    per_plane: Shared<[u32]>,
}

#[cube]
fn scratch() -> Scratch {
    Scratch {
        sa: Shared::<[u32]>::new_slice(CUBE as usize),
        sb: Shared::<[u32]>::new_slice(CUBE as usize),
        sc: Shared::<[u32]>::new_slice(CUBE as usize),
        per_plane: Shared::<[u32]>::new_slice(3 * PLANES as usize),
    }
}

/// [`scan3`] over the cube; with `planes` (32-unit planes with plane operations) a plane scan
/// and one exchange of the planes' totals: 2 barriers instead of 18.
#[cube]
fn cube_scan3(
    a: u32,
    b: u32,
    c: u32,
    s: &mut Scratch,
    #[comptime] planes: bool,
) -> (u32, u32, u32, u32, u32, u32) {
    if comptime![planes] {
        plane_scan3(a, b, c, &mut s.per_plane)
    } else {
        scan3(a, b, c, &mut s.sa, &mut s.sb, &mut s.sc, CUBE)
    }
}

#[cube]
fn plane_scan3(a: u32, b: u32, c: u32, per_plane: &mut [u32]) -> (u32, u32, u32, u32, u32, u32) {
    let ia = plane_inclusive_sum(a);
    let ib = plane_inclusive_sum(b);
    let ic = plane_inclusive_sum(c);
    let plane = UNIT_POS / PLANE;
    let pw = PLANES as usize;
    sync_cube();
    if UNIT_POS % PLANE == PLANE - 1 {
        per_plane[plane as usize] = ia;
        per_plane[pw + plane as usize] = ib;
        per_plane[2 * pw + plane as usize] = ic;
    }
    sync_cube();
    let mut ba = 0u32;
    let mut bb = 0u32;
    let mut bc = 0u32;
    let mut ta = 0u32;
    let mut tb = 0u32;
    let mut tc = 0u32;
    #[unroll]
    for q in 0..PLANES {
        let xa = per_plane[q as usize];
        let xb = per_plane[pw + q as usize];
        let xc = per_plane[2 * pw + q as usize];
        if q < plane {
            ba += xa;
            bb += xb;
            bc += xc;
        }
        ta += xa;
        tb += xb;
        tc += xc;
    }
    (ba + ia - a, bb + ib - b, bc + ic - c, ta, tb, tc)
}

/// [`cube_min_u32`] over the cube, through the planes' minima with `planes`.
#[cube]
fn cube_min(v: u32, s: &mut Scratch, #[comptime] planes: bool) -> u32 {
    if comptime![planes] {
        plane_cube_min(v, &mut s.per_plane)
    } else {
        cube_min_u32(v, &mut s.sa, CUBE)
    }
}

#[cube]
fn plane_cube_min(v: u32, per_plane: &mut [u32]) -> u32 {
    let m = plane_min(v);
    sync_cube();
    let lane = UNIT_POS % PLANE;
    if lane == 0 {
        per_plane[(UNIT_POS / PLANE) as usize] = m;
    }
    sync_cube();
    let mut r = u32::new(EXCLUDED as i64);
    #[unroll]
    for q in 0..PLANES {
        r = min(r, per_plane[q as usize]);
    }
    r
}

/// Where candidate slot `s` of a row lies in its `SLOTS` words: slot `u * FINAL_PER + j`, the
/// final kernel's unit `u`'s `j`-th, at `j * CUBE + u`, so that its loads are coalesced.
#[cube]
fn slot_address(s: usize) -> usize {
    (s % FINAL_PER as usize) * CUBE as usize + s / FINAL_PER as usize
}

/// The row's k: 1 for a greedy row (temperature 0 or top-k 1), otherwise its top-k, within
/// `1..=stride` (the host plans this kernel only for rows whose top-k is in `2..=stride`).
#[cube]
fn row_k(params: &[u32], row: usize, stride: usize) -> u32 {
    let base = row * PARAM_WORDS as usize;
    let temperature = f32::reinterpret(params[base + P_TEMPERATURE as usize]);
    let k = params[base + P_TOP_K as usize];
    let k = select(temperature == 0f32 || k == 1u32, 1u32, k);
    min(max(k, 1u32), stride as u32)
}

/// The top-k of the keys the cube's units hold (`n` each) among those that are not `EXCLUDED`
/// and at most `bound`, under the order (key, id), ids ascending with the unit and then with the
/// index in a unit: the returned `(tk, jk)` keeps every key below `tk` and the first `jk` at
/// it; `(EXCLUDED, 0)` keeps every candidate (there are fewer than `k`, which only happens when
/// `bound` is `EXCLUDED`). Four passes of 8 bits, each a histogram of the keys in the current
/// prefix's range in shared memory (a unit adds each run of equal digits once: its keys are
/// neighbours, whose high digits mostly agree, and shared atomics on one bin serialise); for
/// `k` 1 (greedy rows) the smallest key instead.
#[cube]
#[allow(clippy::too_many_arguments)]
fn select_k(
    keys: &Array<u32>,
    #[comptime] n: u32,
    k: u32,
    bound: u32,
    hist: &[Atomic<u32>],
    s: &mut Scratch,
    pick: &mut [u32],
    #[comptime] planes: bool,
) -> (u32, u32) {
    let u = UNIT_POS as usize;
    let mut prefix = 0u32;
    let mut below = 0u32;
    let mut all = false;
    let mut passes = u32::new(PASSES as i64);
    if k == 1u32 {
        let mut m = u32::new(EXCLUDED as i64);
        #[unroll]
        for j in 0..n {
            let key = keys[j as usize];
            if key <= bound {
                m = min(m, key);
            }
        }
        prefix = cube_min(m, s, planes);
        all = prefix == EXCLUDED;
        passes = 0u32;
    }
    for pass in 0..passes {
        let shift = 32u32 - BITS * (pass + 1u32);
        let hi_shift = select(pass == 0u32, 0u32, shift + BITS);
        sync_cube();
        hist[u].store(0u32);
        sync_cube();
        let mut run_digit = 0u32;
        let mut run = 0u32;
        #[unroll]
        for j in 0..n {
            let key = keys[j as usize];
            let in_range = pass == 0u32 || (key >> hi_shift) == prefix;
            if key != EXCLUDED && key <= bound && in_range {
                let d = (key >> shift) & (BINS - 1u32);
                if run > 0u32 && d != run_digit {
                    hist[run_digit as usize].fetch_add(run);
                    run = 0u32;
                }
                run_digit = d;
                run += 1u32;
            }
        }
        if run > 0u32 {
            hist[run_digit as usize].fetch_add(run);
        }
        sync_cube();
        let c = hist[u].load();
        let (e, _e1, _e2, total, _t1, _t2) = cube_scan3(c, 0u32, 0u32, s, planes);
        if pass == 0u32 && total < k {
            all = true;
            break;
        }
        // The bin where the k-th key falls: exactly one unit's.
        if below + e < k && k <= below + e + c {
            pick[0] = u as u32;
            pick[1] = e;
        }
        sync_cube();
        prefix = (prefix << BITS) | pick[0];
        below += pick[1];
    }
    let mut tk = prefix;
    let mut jk = k - below;
    if all {
        tk = u32::new(EXCLUDED as i64);
        jk = 0u32;
    }
    (tk, jk)
}

/// Where the kept set `(tk, jk)` of [`select_k`] lies in the order of the units and their keys:
/// this unit's first position in it, the tie rank (among the keys equal to `tk`) of its first
/// key at `tk`, and the set's size.
#[cube]
#[allow(clippy::too_many_arguments)]
fn kept_offsets(
    keys: &Array<u32>,
    #[comptime] n: u32,
    tk: u32,
    jk: u32,
    s: &mut Scratch,
    #[comptime] planes: bool,
) -> (u32, u32, u32) {
    let mut ties = 0u32;
    let mut below = 0u32;
    #[unroll]
    for j in 0..n {
        let key = keys[j as usize];
        if key < tk {
            below += 1u32;
        } else if key == tk {
            ties += 1u32;
        }
    }
    let (et, eb, _e, tt, tb, _t) = cube_scan3(ties, below, 0u32, s, planes);
    (eb + min(et, jk), et, tb + min(tt, jk))
}

/// Whether `(tk, jk)` keeps `key`, the next key in id order, when `rank` keys at `tk` came
/// before it; and the rank after it.
#[cube]
fn keeps(key: u32, tk: u32, jk: u32, rank: u32) -> (bool, u32) {
    let tie = key == tk;
    (
        key < tk || (tie && rank < jk),
        rank + select(tie, 1u32, 0u32),
    )
}

/// The kept set of [`select_k`] over `keys` (`n` per unit, with their `slots`, in slot order
/// across the units) into `set_key` and `set_slot`, in slot order; returns its size.
#[cube]
#[allow(clippy::too_many_arguments)]
fn gather_top_k(
    keys: &Array<u32>,
    slots: &Array<u32>,
    #[comptime] n: u32,
    k: u32,
    bound: u32,
    hist: &[Atomic<u32>],
    s: &mut Scratch,
    pick: &mut [u32],
    set_key: &mut [u32],
    set_slot: &mut [u32],
    #[comptime] planes: bool,
) -> u32 {
    let (tk, jk) = select_k(keys, n, k, bound, hist, s, pick, planes);
    let (p0, r0, size) = kept_offsets(keys, n, tk, jk, s, planes);
    let mut pos = p0 as usize;
    let mut rank = r0;
    #[unroll]
    for j in 0..n {
        let key = keys[j as usize];
        let (keep, next) = keeps(key, tk, jk, rank);
        rank = next;
        if keep {
            set_key[pos] = key;
            set_slot[pos] = slots[j as usize];
            pos += 1;
        }
    }
    sync_cube();
    size
}

/// Keys `LOCAL_CHUNK` ids per cube (after the penalty; with `mark`, the row's id in `tokens`
/// is first added to the presence mask, as `prepare_kernel` does) and writes the cube's top-k
/// (k of [`row_k`]) to its `stride` slots of `cand_keys` and `cand_ids` in id order, the other
/// slots `EXCLUDED`, and its k-th key to `bounds` (`EXCLUDED` when it has fewer than k).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn local_top_kernel<F: Float>(
    logits: &[F],
    params: &[u32],
    tokens: &[u32],
    presence: &mut [u32],
    cand_keys: &mut [u32],
    cand_ids: &mut [u32],
    bounds: &mut [u32],
    vocab: usize,
    words: usize,
    cubes: usize,
    stride: usize,
    #[comptime] mark: bool,
    #[comptime] planes: bool,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS_Y as usize;
    let cube = CUBE_POS_X as usize;
    let u = UNIT_POS as usize;
    let penalty = f32::reinterpret(params[row * PARAM_WORDS as usize + P_PENALTY as usize]);
    let marked = marked_id(tokens, row, vocab, mark);
    let k = row_k(params, row, stride);
    // Keyed in a coalesced order (consecutive units, consecutive ids), then handed over
    // through shared memory so that each unit holds `LOCAL_PER` consecutive ids.
    let chunk = cube * LOCAL_CHUNK as usize;
    let mut staged = Shared::<[u32]>::new_slice(LOCAL_CHUNK as usize);
    #[unroll]
    for j in 0..LOCAL_PER {
        let at = j as usize * CUBE as usize + u;
        let i = chunk + at;
        let mut key = u32::new(EXCLUDED as i64);
        if i < vocab {
            key = penalised_key(logits, presence, row, i, vocab, words, marked, penalty);
        }
        staged[at] = key;
    }
    sync_cube();
    let first = chunk + u * LOCAL_PER as usize;
    let mut keys = Array::<u32>::new(LOCAL_PER as usize);
    #[unroll]
    for j in 0..LOCAL_PER {
        keys[j as usize] = staged[u * LOCAL_PER as usize + j as usize];
    }
    let hist = Shared::<[Atomic<u32>]>::new_slice(BINS as usize);
    let mut s = scratch();
    let mut pick = Shared::<[u32]>::new_slice(2usize);
    let none = u32::new(EXCLUDED as i64);
    let (tk, jk) = select_k(&keys, LOCAL_PER, k, none, &hist, &mut s, &mut pick, planes);
    let (p0, r0, kept) = kept_offsets(&keys, LOCAL_PER, tk, jk, &mut s, planes);
    let slot0 = cube * stride;
    let row_slots = row * SLOTS as usize;
    let mut pos = p0 as usize;
    let mut rank = r0;
    #[unroll]
    for j in 0..LOCAL_PER {
        let key = keys[j as usize];
        let (keep, next) = keeps(key, tk, jk, rank);
        rank = next;
        if keep {
            let at = row_slots + slot_address(slot0 + pos);
            cand_keys[at] = key;
            cand_ids[at] = (first + j as usize) as u32;
            pos += 1;
        }
    }
    for s in range_stepped(kept as usize + u, stride, CUBE as usize) {
        cand_keys[row_slots + slot_address(slot0 + s)] = u32::new(EXCLUDED as i64);
    }
    if u == 0 {
        bounds[row * cubes + cube] = select(kept == k, tk, u32::new(EXCLUDED as i64));
    }
}

/// The draw of each row (one cube per row) from the candidates of `local_top_kernel`: the
/// row's maximum, its top-k set, top-p over that set in value order, and the inverse-CDF draw
/// of the kept set in id order (`u32::MAX` for a row without candidates). Same rules and the
/// same fixed-point masses as the radix plan's `stage_kernel` and `draw_kernel`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn final_draw_kernel(
    cand_keys: &[u32],
    cand_ids: &[u32],
    bounds: &[u32],
    params: &[u32],
    uniform: &[f32],
    out: &mut [u32],
    cubes: usize,
    stride: usize,
    scale: f32,
    #[comptime] planes: bool,
) {
    let row = CUBE_POS_Y as usize;
    let u = UNIT_POS as usize;
    let slots = cubes * stride;
    let base = row * SLOTS as usize;
    let first = u * FINAL_PER as usize;
    let mut keys = Array::<u32>::new(FINAL_PER as usize);
    let mut m = u32::new(EXCLUDED as i64);
    #[unroll]
    for j in 0..FINAL_PER {
        let s = first + j as usize;
        let mut key = u32::new(EXCLUDED as i64);
        if s < slots {
            key = cand_keys[base + j as usize * CUBE as usize + u];
        }
        keys[j as usize] = key;
        m = min(m, key);
    }
    let mut b = u32::new(EXCLUDED as i64);
    for c in range_stepped(u, cubes, CUBE as usize) {
        b = min(b, bounds[row * cubes + c]);
    }
    let hist = Shared::<[Atomic<u32>]>::new_slice(BINS as usize);
    let mut s = scratch();
    let mut pick = Shared::<[u32]>::new_slice(2usize);
    let t_max = cube_min(m, &mut s, planes);
    let bound = cube_min(b, &mut s, planes);
    if t_max == EXCLUDED {
        if u == 0 {
            out[row] = u32::MAX;
        }
        terminate!();
    }
    let pbase = row * PARAM_WORDS as usize;
    let temperature = f32::reinterpret(params[pbase + P_TEMPERATURE as usize]);
    let top_p = f32::reinterpret(params[pbase + P_TOP_P as usize]);
    let k = row_k(params, row, stride);

    // The candidates no larger than the bound (a few times k, usually), in slot order: moved
    // to shared memory and then `SURVIVOR_PER` per unit when they fit, since the searches' cost
    // grows with the keys each unit holds.
    let mut alive = 0u32;
    #[unroll]
    for j in 0..FINAL_PER {
        let key = keys[j as usize];
        if key != EXCLUDED && key <= bound {
            alive += 1u32;
        }
    }
    let (a0, _e1, _e2, survivors, _t1, _t2) = cube_scan3(alive, 0u32, 0u32, &mut s, planes);
    let mut set_key = Shared::<[u32]>::new_slice(MAX_K as usize);
    let mut set_slot = Shared::<[u32]>::new_slice(MAX_K as usize);
    let n = if survivors <= SURVIVORS {
        let mut sk = Shared::<[u32]>::new_slice(SURVIVORS as usize);
        let mut ss = Shared::<[u32]>::new_slice(SURVIVORS as usize);
        let mut at = a0 as usize;
        #[unroll]
        for j in 0..FINAL_PER {
            let key = keys[j as usize];
            if key != EXCLUDED && key <= bound {
                sk[at] = key;
                ss[at] = (first + j as usize) as u32;
                at += 1;
            }
        }
        sync_cube();
        let mut few = Array::<u32>::new(SURVIVOR_PER as usize);
        let mut few_slots = Array::<u32>::new(SURVIVOR_PER as usize);
        #[unroll]
        for j in 0..SURVIVOR_PER {
            let i = u * SURVIVOR_PER as usize + j as usize;
            let mut key = u32::new(EXCLUDED as i64);
            let mut slot = 0u32;
            if i < survivors as usize {
                key = sk[i];
                slot = ss[i];
            }
            few[j as usize] = key;
            few_slots[j as usize] = slot;
        }
        gather_top_k(
            &few,
            &few_slots,
            SURVIVOR_PER,
            k,
            bound,
            &hist,
            &mut s,
            &mut pick,
            &mut set_key,
            &mut set_slot,
            planes,
        )
    } else {
        let mut slots_of = Array::<u32>::new(FINAL_PER as usize);
        #[unroll]
        for j in 0..FINAL_PER {
            slots_of[j as usize] = (first + j as usize) as u32;
        }
        gather_top_k(
            &keys,
            &slots_of,
            FINAL_PER,
            k,
            bound,
            &hist,
            &mut s,
            &mut pick,
            &mut set_key,
            &mut set_slot,
            planes,
        )
    };

    // Unit `u` holds element `u` of the set; its place in value order (ties: the lower id first).
    let mut by_value_h = Shared::<[u32]>::new_slice(MAX_K as usize);
    let mut by_value_l = Shared::<[u32]>::new_slice(MAX_K as usize);
    let mut by_value_at = Shared::<[u32]>::new_slice(MAX_K as usize);
    let mut kept = Shared::<[u32]>::new_slice(MAX_K as usize);
    let mine = (u as u32) < n;
    let mut qh = 0u32;
    let mut ql = 0u32;
    if mine {
        let key = set_key[u];
        let (h, l) = mass_of(key, t_max, temperature, scale);
        qh = h;
        ql = l;
        let mut place = 0u32;
        for v in 0..n {
            let other = set_key[v as usize];
            if other < key || (other == key && v < u as u32) {
                place += 1u32;
            }
        }
        by_value_h[place as usize] = qh;
        by_value_l[place as usize] = ql;
        by_value_at[place as usize] = u as u32;
    }
    sync_cube();

    // Top-p: the smallest prefix in value order whose mass reaches `top_p` of the set's.
    let mut vh = 0u32;
    let mut vl = 0u32;
    if mine {
        vh = by_value_h[u];
        vl = by_value_l[u];
    }
    let (eh0, el0, _e, zh0, zl0, _t) = cube_scan3(vh, vl, 0u32, &mut s, planes);
    let (eh, el) = normalize(eh0, el0);
    let (zh, zl) = normalize(zh0, zl0);
    let sampled = k > 1u32;
    if mine {
        let mut keep = 1u32;
        if sampled && top_p < 1f32 {
            let (th, tl) = top_p_target(top_p, zh, zl);
            keep = select(mass_lt(eh, el, th, tl), 1u32, 0u32);
        }
        kept[by_value_at[u] as usize] = keep;
    }
    sync_cube();

    // The draw in id order over the kept set.
    let mut dh = 0u32;
    let mut dl = 0u32;
    if mine && kept[u] == 1u32 {
        dh = qh;
        dl = ql;
    }
    let (bh0, bl0, _e3, gh0, gl0, _t3) = cube_scan3(dh, dl, 0u32, &mut s, planes);
    let (bh, bl) = normalize(bh0, bl0);
    let (gh, gl) = normalize(gh0, gl0);
    let (uh0, ul0) = mass_from_f32(uniform[row] * mass_to_f32(gh, gl));
    let mut uh = uh0;
    let mut ul = ul0;
    if !mass_lt(uh, ul, gh, gl) {
        let (h, l) = mass_sub(gh, gl, 0u32, 1u32);
        uh = h;
        ul = l;
    }
    let (ah, al) = mass_add(bh, bl, dh, dl);
    if mine && !mass_lt(uh, ul, bh, bl) && mass_lt(uh, ul, ah, al) {
        out[row] = cand_ids[base + slot_address(set_slot[u] as usize)];
    }
}
