//! The sampler's kernels: `prepare` (penalty, keys, the row maximum), the `stage` kernel (one
//! radix pass of the top-k or top-p search per launch, then a final launch for the kept set's
//! per-cube masses), and `draw` (the inverse-CDF draw in id order). `presence_mark` adds the
//! step's token to the penalty's presence mask (`prepare` does too, when asked to).
//!
//! Every multi-cube kernel handles `CHUNK` consecutive ids of one row per cube (`CUBE_POS_X`) and
//! one row per `CUBE_POS_Y`. The searches' state lives in a record per launch and row: every
//! cube of a launch recomputes it from the previous launch's record and histogram (the same
//! integers, so the same result), cube 0 stores it for the next launch.

use cubecl::prelude::*;

use super::fixed::*;

/// Radix bits per pass; a pass's histogram has one bin per unit.
pub(crate) const BITS: u32 = 8;
pub(crate) const BINS: u32 = 1 << BITS;
/// Passes of one search over a 32-bit key.
pub(crate) const PASSES: u32 = 32 / BITS;
/// Histogram stages: the top-k search's passes, then the top-p search's.
pub(crate) const STAGES: u32 = 2 * PASSES;
/// Units per cube (== BINS).
pub(crate) const CUBE: u32 = BINS;
/// Ids per unit and per cube.
pub(crate) const PER_UNIT: u32 = 4;
pub(crate) const CHUNK: u32 = CUBE * PER_UNIT;
/// Histogram words per row: `[STAGES, 3, BINS]` (count, mass high limb, mass low limb).
pub(crate) const HIST_WORDS: u32 = STAGES * 3 * BINS;

/// Parameter words per row: temperature (f32 bits), top-k, top-p (f32 bits), penalty (f32 bits).
pub(crate) const PARAM_WORDS: u32 = 4;
pub(crate) const P_TEMPERATURE: u32 = 0;
pub(crate) const P_TOP_K: u32 = 1;
pub(crate) const P_TOP_P: u32 = 2;
pub(crate) const P_PENALTY: u32 = 3;

/// The kind of the final launch of the stage kernel (after the histogram passes `0..PASSES` of
/// the top-k search and `PASSES..STAGES` of the top-p search).
pub(crate) const FINAL: u32 = STAGES;
/// The `prev` of the first launch.
pub(crate) const NO_STAGE: u32 = u32::MAX;

/// Record words (u32) per launch and row.
pub(crate) const REC: u32 = 15;
const R_T_MAX: u32 = 0;
const R_MODE: u32 = 1;
/// The top-k boundary key (the kept set's boundary key in the last record).
const R_TK: u32 = 2;
/// Ties kept at that key (in id order).
const R_JK: u32 = 3;
/// The top-k set's mass.
const R_ZK: u32 = 4;
/// The current search: key prefix, count and mass of the keys below the prefix's range.
const R_PREFIX: u32 = 6;
const R_CB: u32 = 7;
const R_MB: u32 = 8;
/// The top-p search's target mass.
const R_TGT: u32 = 10;
/// The bin chosen by the last pass: count and mass.
const R_BIN_C: u32 = 12;
const R_BIN_M: u32 = 13;

/// Modes (bits).
const MODE_GREEDY: u32 = 1;
pub(crate) const MODE_TOPK: u32 = 2;
pub(crate) const MODE_TOPP: u32 = 4;
const MODE_NONE: u32 = 8;

/// The id `tokens` marks in `row` (`vocab`, never an id, when nothing is marked or the token is
/// outside the vocabulary).
#[cube]
pub(crate) fn marked_id(tokens: &[u32], row: usize, vocab: usize, #[comptime] mark: bool) -> usize {
    let mut marked = vocab;
    if comptime![mark] {
        marked = min(tokens[row] as usize, vocab);
    }
    marked
}

/// The key of logit `i` of `row` after the repetition penalty (`penalty` 1: none, the mask is
/// not read). The id `marked` counts as present and gets its bit set in the mask: the unit that
/// holds an id is the only one that writes its word, and the other units of the word read their
/// own bits, which the write leaves as they were.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn penalised_key<F: Float>(
    logits: &[F],
    presence: &mut [u32],
    row: usize,
    i: usize,
    vocab: usize,
    words: usize,
    marked: usize,
    penalty: f32,
) -> u32 {
    let mut l = f32::cast_from(logits[row * vocab + i]);
    let w = row * words + i / 32;
    let mut bit = 0u32;
    if penalty != 1f32 {
        bit = (presence[w] >> (i % 32) as u32) & 1u32;
    }
    if i == marked {
        bit = 1u32;
        presence[w] |= 1u32 << (i % 32) as u32;
    }
    if bit == 1u32 {
        l = select(l > 0f32, l / penalty, l * penalty);
    }
    desc_key(l)
}

/// Penalty, keys and each cube's smallest key; zeroes the row's histograms for the stages.
/// With `mark`, first adds the row's id in `tokens` to its presence mask (as
/// [`presence_mark_kernel`]; ids outside the vocabulary are ignored): the unit that holds that id
/// counts it as present and sets its bit, a word no other cube reads (a cube's ids fill whole
/// mask words).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn prepare_kernel<F: Float>(
    logits: &[F],
    params: &[u32],
    tokens: &[u32],
    presence: &mut [u32],
    keys: &mut [u32],
    partial_min: &mut [u32],
    hist: &mut [Atomic<u32>],
    vocab: usize,
    words: usize,
    cubes: usize,
    #[comptime] mark: bool,
    #[define(F)] _dtype: ElemType,
) {
    let row = CUBE_POS_Y as usize;
    let cube = CUBE_POS_X as usize;
    let u = UNIT_POS as usize;
    let penalty = f32::reinterpret(params[row * PARAM_WORDS as usize + P_PENALTY as usize]);
    let marked = marked_id(tokens, row, vocab, mark);
    let mut scratch = Shared::<[u32]>::new_slice(CUBE as usize);
    let mut m = u32::new(EXCLUDED as i64);
    #[unroll]
    for k in 0..PER_UNIT {
        let i = cube * CHUNK as usize + k as usize * CUBE as usize + u;
        if i < vocab {
            let key = penalised_key(logits, presence, row, i, vocab, words, marked, penalty);
            keys[row * vocab + i] = key;
            m = min(m, key);
        }
    }
    let smallest = cube_min_u32(m, &mut scratch, CUBE);
    if u == 0 {
        partial_min[row * cubes + cube] = smallest;
    }
    let hist_row = row * HIST_WORDS as usize;
    for w in range_stepped(
        cube * CUBE as usize + u,
        HIST_WORDS as usize,
        cubes * CUBE as usize,
    ) {
        hist[hist_row + w].store(0u32);
    }
}

/// One launch of the selection, `stage` of the launch list (see `sampling::SamplingPlan`):
/// `kind` is a histogram pass of the top-k search (`pass`), of the top-p search
/// (`PASSES + pass`) or the final stage (`FINAL`); `prev` is the kind of the launch before
/// (`NO_STAGE` for the first); `searches` has the mode bits of the searches the list has;
/// `passes` is the passes per search, fewer than `PASSES` where the keys' low bits are known
/// (see [`full_key`]).
///
/// The first launch starts the row's record (the maximum, the mode). Every launch first applies
/// the previous launch's histogram to the record (the bin where the search's target falls; a
/// search's first histogram also gives its totals), finishes the top-k search after its last
/// pass, starts the top-p search at its first, then, if its search is on for the row,
/// histograms its pass: count and mass per digit of the keys in the current prefix's range.
/// The final stage finishes the top-p search, stores the kept set (boundary key, ties kept at
/// it) and writes each cube's mass below the boundary and ties at it.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_kernel(
    keys: &[u32],
    params: &[u32],
    partial_min: &[u32],
    hist: &mut [Atomic<u32>],
    records: &mut [u32],
    partials: &mut [u32],
    vocab: usize,
    cubes: usize,
    stage: u32,
    kind: u32,
    prev: u32,
    searches: u32,
    passes: u32,
    scale: f32,
) {
    let row = CUBE_POS_Y as usize;
    let cube = CUBE_POS_X as usize;
    let u = UNIT_POS as usize;
    let pbase = row * PARAM_WORDS as usize;
    let temperature = f32::reinterpret(params[pbase + P_TEMPERATURE as usize]);
    let top_k = params[pbase + P_TOP_K as usize];
    let top_p = f32::reinterpret(params[pbase + P_TOP_P as usize]);
    let rec_row = row * (STAGES as usize + 1) * REC as usize;
    let hist_row = row * HIST_WORDS as usize;
    let mut sa = Shared::<[u32]>::new_slice(CUBE as usize);
    let mut sb = Shared::<[u32]>::new_slice(CUBE as usize);
    let mut sc = Shared::<[u32]>::new_slice(CUBE as usize);
    let mut pick = Shared::<[u32]>::new_slice(8usize);

    // The record this launch starts from.
    let from = rec_row + select(stage == 0u32, 0u32, stage - 1u32) as usize * REC as usize;
    let mut t_max = records[from + R_T_MAX as usize];
    let mut mode = records[from + R_MODE as usize];
    let mut tk = records[from + R_TK as usize];
    let mut jk = records[from + R_JK as usize];
    let mut zk_h = records[from + R_ZK as usize];
    let mut zk_l = records[from + R_ZK as usize + 1];
    let mut prefix = records[from + R_PREFIX as usize];
    let mut cb = records[from + R_CB as usize];
    let mut mb_h = records[from + R_MB as usize];
    let mut mb_l = records[from + R_MB as usize + 1];
    let mut tgt_h = records[from + R_TGT as usize];
    let mut tgt_l = records[from + R_TGT as usize + 1];
    let mut bin_c = records[from + R_BIN_C as usize];
    let mut bin_h = records[from + R_BIN_M as usize];
    let mut bin_l = records[from + R_BIN_M as usize + 1];

    if stage == 0u32 {
        // The row's maximum: the smallest key of all cubes.
        let mut m = u32::new(EXCLUDED as i64);
        for c in range_stepped(u, cubes, CUBE as usize) {
            m = min(m, partial_min[row * cubes + c]);
        }
        t_max = cube_min_u32(m, &mut sa, CUBE);
        mode = 0u32;
        if t_max == EXCLUDED {
            mode = u32::new(MODE_NONE as i64);
        } else if temperature == 0f32 || top_k == 1u32 {
            mode = u32::new(MODE_GREEDY as i64);
        } else {
            if top_k > 0u32 {
                mode |= MODE_TOPK;
            }
            if top_p < 1f32 {
                mode |= MODE_TOPP;
            }
            // Only the searches the launch list has (the host plans them from the same
            // parameters).
            mode &= searches;
        }
        tk = u32::new(EXCLUDED as i64);
        jk = 0u32;
        zk_h = 0u32;
        zk_l = 0u32;
        prefix = 0u32;
        cb = 0u32;
        mb_h = 0u32;
        mb_l = 0u32;
        tgt_h = 0u32;
        tgt_l = 0u32;
        bin_c = 0u32;
        bin_h = 0u32;
        bin_l = 0u32;
    } else {
        // Apply the previous launch's histogram.
        let prev_topk = prev < PASSES;
        let prev_pass = prev % PASSES;
        let prev_ran = select(
            prev_topk,
            (mode & MODE_TOPK) != 0u32,
            prev < FINAL && (mode & MODE_TOPP) != 0u32,
        );
        if prev_ran {
            let base = hist_row + (stage as usize - 1) * 3 * BINS as usize;
            let mut c = hist[base + u].load();
            let (h0, l0) = normalize(
                hist[base + BINS as usize + u].load(),
                hist[base + 2 * BINS as usize + u].load(),
            );
            let mut h = h0;
            let mut l = l0;
            let shift = 32u32 - BITS * (prev_pass + 1u32);
            let hi_shift = select(prev_pass == 0u32, 0u32, shift + BITS);
            if !prev_topk && jk > 0u32 {
                // The ties kept at the top-k boundary are counted here, not by the histogram
                // (which only sees keys below it): `jk` of them, each of the same mass.
                let in_range = prev_pass == 0u32 || (tk >> hi_shift) == prefix;
                if in_range && ((tk >> shift) & (BINS - 1u32)) == u as u32 {
                    let (qh, ql) = mass_of(tk, t_max, temperature, scale);
                    let (xh, xl) = mass_mul(qh, ql, jk);
                    c += jk;
                    let (nh, nl) = mass_add(h, l, xh, xl);
                    h = nh;
                    l = nl;
                }
            }
            let (ec, eh0, el0, tc, th0, tl0) = scan3(c, h, l, &mut sa, &mut sb, &mut sc, CUBE);
            let (eh, el) = normalize(eh0, el0);
            if prev_pass == 0u32 {
                // A search's first histogram holds its whole domain.
                if prev_topk {
                    if top_k >= tc {
                        // Top-k keeps every candidate.
                        mode &= MODE_TOPK ^ 0xFFFF_FFFFu32;
                    }
                } else if tk == EXCLUDED {
                    // Top-p over every candidate: its target is `top_p` of their mass (with
                    // top-k it was set from the top-k set's mass when the search started).
                    let (th, tl) = normalize(th0, tl0);
                    let (gh, gl) = top_p_target(top_p, th, tl);
                    tgt_h = gh;
                    tgt_l = gl;
                }
            }
            let searching = select(
                prev_topk,
                (mode & MODE_TOPK) != 0u32,
                (mode & MODE_TOPP) != 0u32,
            );
            if searching {
                // The bin where the target falls: exactly one unit's, the sums being exact.
                let below = cb + ec;
                let mut found = below < top_k && top_k <= below + c;
                if !prev_topk {
                    let (bh, bl) = mass_add(mb_h, mb_l, eh, el);
                    let (ah, al) = mass_add(bh, bl, h, l);
                    found = mass_lt(bh, bl, tgt_h, tgt_l) && !mass_lt(ah, al, tgt_h, tgt_l);
                }
                if found {
                    pick[0] = u as u32;
                    pick[1] = ec;
                    pick[2] = eh;
                    pick[3] = el;
                    pick[4] = c;
                    pick[5] = h;
                    pick[6] = l;
                }
                sync_cube();
                prefix = (prefix << BITS) | pick[0];
                cb += pick[1];
                let (nh, nl) = mass_add(mb_h, mb_l, pick[2], pick[3]);
                mb_h = nh;
                mb_l = nl;
                bin_c = pick[4];
                bin_h = pick[5];
                bin_l = pick[6];
            }
        }
        if prev == passes - 1u32 && (mode & MODE_TOPK) != 0u32 {
            // The top-k set: the keys below the boundary and the first `jk` ids at it.
            tk = full_key(prefix, passes);
            jk = top_k - cb;
            let (qh, ql) = mass_of(tk, t_max, temperature, scale);
            let (xh, xl) = mass_mul(qh, ql, jk);
            let (zh, zl) = mass_add(mb_h, mb_l, xh, xl);
            zk_h = zh;
            zk_l = zl;
        }
    }

    if kind == PASSES {
        // The top-p search starts (below the top-k boundary when there is one).
        prefix = 0u32;
        cb = 0u32;
        mb_h = 0u32;
        mb_l = 0u32;
        if tk != EXCLUDED {
            let (gh, gl) = top_p_target(top_p, zk_h, zk_l);
            tgt_h = gh;
            tgt_l = gl;
        }
    }

    if kind == FINAL {
        // The kept set: keys below `tk` and the first `jk` ids at it.
        if (mode & MODE_NONE) != 0u32 {
            tk = u32::new(EXCLUDED as i64);
            jk = 0u32;
        } else if (mode & MODE_GREEDY) != 0u32 {
            tk = t_max;
            jk = 1u32;
        } else if (mode & MODE_TOPP) != 0u32 {
            // The fewest ties at the boundary that reach the target.
            tk = full_key(prefix, passes);
            let (qh, ql) = mass_of(tk, t_max, temperature, scale);
            let n = bin_c;
            let (nh, nl) = mass_sub(tgt_h, tgt_l, mb_h, mb_l);
            let estimate = f32::ceil(mass_to_f32(nh, nl) / mass_to_f32(qh, ql));
            let mut j = u32::cast_from(max(min(estimate, f32::cast_from(n)), 1f32));
            loop {
                if j <= 1u32 {
                    break;
                }
                let (xh, xl) = mass_mul(qh, ql, j - 1u32);
                let (ah, al) = mass_add(mb_h, mb_l, xh, xl);
                if mass_lt(ah, al, tgt_h, tgt_l) {
                    break;
                }
                j -= 1u32;
            }
            loop {
                if j >= n {
                    break;
                }
                let (xh, xl) = mass_mul(qh, ql, j);
                let (ah, al) = mass_add(mb_h, mb_l, xh, xl);
                if !mass_lt(ah, al, tgt_h, tgt_l) {
                    break;
                }
                j += 1u32;
            }
            jk = j;
        }
        // Otherwise top-k's set (already in tk, jk) or, with top-k off too, every candidate
        // (tk = EXCLUDED, jk = 0).
    }

    if cube == 0 && u == 0 {
        let to = rec_row + stage as usize * REC as usize;
        records[to + R_T_MAX as usize] = t_max;
        records[to + R_MODE as usize] = mode;
        records[to + R_TK as usize] = tk;
        records[to + R_JK as usize] = jk;
        records[to + R_ZK as usize] = zk_h;
        records[to + R_ZK as usize + 1] = zk_l;
        records[to + R_PREFIX as usize] = prefix;
        records[to + R_CB as usize] = cb;
        records[to + R_MB as usize] = mb_h;
        records[to + R_MB as usize + 1] = mb_l;
        records[to + R_TGT as usize] = tgt_h;
        records[to + R_TGT as usize + 1] = tgt_l;
        records[to + R_BIN_C as usize] = bin_c;
        records[to + R_BIN_M as usize] = bin_h;
        records[to + R_BIN_M as usize + 1] = bin_l;
    }

    let topk_stage = kind < PASSES;
    let run = select(
        topk_stage,
        (mode & MODE_TOPK) != 0u32,
        (mode & MODE_TOPP) != 0u32,
    );
    let s_cnt = Shared::<[Atomic<u32>]>::new_slice(BINS as usize);
    let s_h = Shared::<[Atomic<u32>]>::new_slice(BINS as usize);
    let s_l = Shared::<[Atomic<u32>]>::new_slice(BINS as usize);
    if kind == FINAL {
        // Each cube's mass below the boundary and ties at it (summed by a tree: shared atomics
        // of every unit on one address would serialise).
        let mut ties = 0u32;
        let mut mh = 0u32;
        let mut ml = 0u32;
        #[unroll]
        for k in 0..PER_UNIT {
            let i = cube * CHUNK as usize + k as usize * CUBE as usize + u;
            if i < vocab {
                let key = keys[row * vocab + i];
                if key < tk {
                    let (qh, ql) = mass_of(key, t_max, temperature, scale);
                    mh += qh;
                    ml += ql;
                } else if key == tk {
                    ties += 1u32;
                }
            }
        }
        let (_e0, _e1, _e2, tt, th, tl) = scan3(ties, mh, ml, &mut sa, &mut sb, &mut sc, CUBE);
        if u == 0 {
            let (h, l) = normalize(th, tl);
            let at = (row * cubes + cube) * 3;
            partials[at] = tt;
            partials[at + 1] = h;
            partials[at + 2] = l;
        }
    } else if run {
        let pass = kind % PASSES;
        s_cnt[u].store(0u32);
        s_h[u].store(0u32);
        s_l[u].store(0u32);
        sync_cube();
        // Top-p searches below the top-k boundary (EXCLUDED when top-k is off).
        let limit = select(topk_stage, EXCLUDED, tk);
        let shift = 32u32 - BITS * (pass + 1u32);
        let hi_shift = select(pass == 0u32, 0u32, shift + BITS);
        #[unroll]
        for k in 0..PER_UNIT {
            let i = cube * CHUNK as usize + k as usize * CUBE as usize + u;
            if i < vocab {
                let key = keys[row * vocab + i];
                let in_range = pass == 0u32 || (key >> hi_shift) == prefix;
                if key < limit && in_range {
                    let d = ((key >> shift) & (BINS - 1u32)) as usize;
                    let (qh, ql) = mass_of(key, t_max, temperature, scale);
                    s_cnt[d].fetch_add(1u32);
                    s_h[d].fetch_add(qh);
                    s_l[d].fetch_add(ql);
                }
            }
        }
        sync_cube();
        let c = s_cnt[u].load();
        if c > 0u32 {
            let (h, l) = normalize(s_h[u].load(), s_l[u].load());
            let base = hist_row + stage as usize * 3 * BINS as usize;
            hist[base + u].fetch_add(c);
            hist[base + BINS as usize + u].fetch_add(h);
            hist[base + 2 * BINS as usize + u].fetch_add(l);
        }
    }
}

/// The key whose high `8 * passes` bits are `prefix`, where the keys' lower bits are known
/// (logits of 16 or 19 significant bits, no penalty): a non-negative value's key has them all
/// set, a negative one's all clear (see [`desc_key`]).
#[cube]
fn full_key(prefix: u32, passes: u32) -> u32 {
    let mut key = prefix;
    if passes < PASSES {
        let low = 32u32 - BITS * passes;
        key = prefix << low;
        if (key & 0x8000_0000u32) == 0u32 {
            key |= (1u32 << low) - 1u32;
        }
    }
    key
}

/// Top-p's target mass: `top_p` of `z`, at least one unit and at most `z`.
#[cube]
pub(crate) fn top_p_target(top_p: f32, zh: u32, zl: u32) -> (u32, u32) {
    let (th, tl) = mass_from_f32(top_p * mass_to_f32(zh, zl));
    let mut h = th;
    let mut l = tl;
    if h == 0u32 && l == 0u32 {
        l = 1u32;
    }
    if mass_lt(zh, zl, h, l) {
        h = zh;
        l = zl;
    }
    (h, l)
}

/// The draw of each row (one cube per row), from the final stage's record (launch `last`): the
/// kept set's mass `Z` per cube (the ties at the boundary kept in id order), the cube whose ids
/// hold the target `u * Z`, then the id inside that cube.
/// Writes `u32::MAX` for a row without candidates.
#[cube(launch_unchecked)]
pub(crate) fn draw_kernel(
    keys: &[u32],
    params: &[u32],
    uniform: &[f32],
    records: &[u32],
    partials: &[u32],
    out: &mut [u32],
    vocab: usize,
    cubes: usize,
    last: u32,
    scale: f32,
) {
    let row = CUBE_POS_Y as usize;
    let u = UNIT_POS as usize;
    let temperature = f32::reinterpret(params[row * PARAM_WORDS as usize + P_TEMPERATURE as usize]);
    let at = row * (STAGES as usize + 1) * REC as usize + last as usize * REC as usize;
    let t_max = records[at + R_T_MAX as usize];
    let mode = records[at + R_MODE as usize];
    let t = records[at + R_TK as usize];
    let j = records[at + R_JK as usize];
    let mut sa = Shared::<[u32]>::new_slice(CUBE as usize);
    let mut sb = Shared::<[u32]>::new_slice(CUBE as usize);
    let mut sc = Shared::<[u32]>::new_slice(CUBE as usize);
    let mut pick = Shared::<[u32]>::new_slice(5usize);
    if (mode & MODE_NONE) != 0u32 {
        if u == 0 {
            out[row] = u32::MAX;
        }
        terminate!();
    }
    let mut qh = 0u32;
    let mut ql = 0u32;
    if j > 0u32 {
        let (h, l) = mass_of(t, t_max, temperature, scale);
        qh = h;
        ql = l;
    }
    if u == 0 {
        pick[4] = u32::MAX;
    }

    // The cube: each unit takes `group` consecutive cubes.
    let group = cubes.div_ceil(CUBE as usize);
    let c0 = min(u * group, cubes);
    let c1 = min(c0 + group, cubes);
    let mut ties = 0u32;
    for c in c0..c1 {
        ties += partials[(row * cubes + c) * 3];
    }
    let (ties_before, _e1, _e2, _t0, _t1, _t2) =
        scan3(ties, 0u32, 0u32, &mut sa, &mut sb, &mut sc, CUBE);
    let mut mh = 0u32;
    let mut ml = 0u32;
    let mut seen = ties_before;
    for c in c0..c1 {
        let p = (row * cubes + c) * 3;
        let tc = partials[p];
        let kept = select(j > seen, min(j - seen, tc), 0u32);
        let (xh, xl) = mass_mul(qh, ql, kept);
        mh += partials[p + 1] + xh;
        ml += partials[p + 2] + xl;
        seen += tc;
    }
    let (gh, gl) = normalize(mh, ml);
    let (eh0, el0, _e3, zh0, zl0, _t5) = scan3(gh, gl, 0u32, &mut sa, &mut sb, &mut sc, CUBE);
    let (bh, bl) = normalize(eh0, el0);
    let (ah, al) = mass_add(bh, bl, gh, gl);
    // The target `u * Z`, below the kept set's mass `Z`.
    let (zh, zl) = normalize(zh0, zl0);
    let (uh0, ul0) = mass_from_f32(uniform[row] * mass_to_f32(zh, zl));
    let mut uh = uh0;
    let mut ul = ul0;
    if !mass_lt(uh, ul, zh, zl) {
        let (h, l) = mass_sub(zh, zl, 0u32, 1u32);
        uh = h;
        ul = l;
    }
    if !mass_lt(uh, ul, bh, bl) && mass_lt(uh, ul, ah, al) {
        let mut cum_h = bh;
        let mut cum_l = bl;
        let mut seen = ties_before;
        let mut done = false;
        for c in c0..c1 {
            let p = (row * cubes + c) * 3;
            let tc = partials[p];
            let kept = select(j > seen, min(j - seen, tc), 0u32);
            let (xh, xl) = mass_mul(qh, ql, kept);
            let (ch, cl) = mass_add(partials[p + 1], partials[p + 2], xh, xl);
            let (nh, nl) = mass_add(cum_h, cum_l, ch, cl);
            if !done && mass_lt(uh, ul, nh, nl) {
                pick[0] = c as u32;
                pick[1] = cum_h;
                pick[2] = cum_l;
                pick[3] = seen;
                done = true;
            }
            cum_h = nh;
            cum_l = nl;
            seen += tc;
        }
    }
    sync_cube();
    let chosen = pick[0] as usize;
    let base_h = pick[1];
    let base_l = pick[2];
    let base_ties = pick[3];

    // The id inside that cube: each unit takes `PER_UNIT` consecutive ids.
    let first = chosen * CHUNK as usize + u * PER_UNIT as usize;
    let mut my_ties = 0u32;
    #[unroll]
    for k in 0..PER_UNIT {
        let i = first + k as usize;
        if i < vocab && keys[row * vocab + i] == t {
            my_ties += 1u32;
        }
    }
    let (rank0, _e4, _e5, _t6, _t7, _t8) =
        scan3(my_ties, 0u32, 0u32, &mut sa, &mut sb, &mut sc, CUBE);
    let mut rank = base_ties + rank0;
    let mut mh = 0u32;
    let mut ml = 0u32;
    #[unroll]
    for k in 0..PER_UNIT {
        let i = first + k as usize;
        if i < vocab {
            let key = keys[row * vocab + i];
            if key < t {
                let (xh, xl) = mass_of(key, t_max, temperature, scale);
                mh += xh;
                ml += xl;
            } else if key == t {
                if rank < j {
                    mh += qh;
                    ml += ql;
                }
                rank += 1u32;
            }
        }
    }
    let (gh, gl) = normalize(mh, ml);
    let (eh0, el0, _e6, _t9, _t10, _t11) = scan3(gh, gl, 0u32, &mut sa, &mut sb, &mut sc, CUBE);
    let (eh, el) = normalize(eh0, el0);
    let (bh, bl) = mass_add(base_h, base_l, eh, el);
    let (ah, al) = mass_add(bh, bl, gh, gl);
    if !mass_lt(uh, ul, bh, bl) && mass_lt(uh, ul, ah, al) {
        let mut cum_h = bh;
        let mut cum_l = bl;
        let mut rank = base_ties + rank0;
        let mut done = false;
        #[unroll]
        for k in 0..PER_UNIT {
            let i = first + k as usize;
            if i < vocab {
                let key = keys[row * vocab + i];
                let mut xh = 0u32;
                let mut xl = 0u32;
                if key < t {
                    let (h, l) = mass_of(key, t_max, temperature, scale);
                    xh = h;
                    xl = l;
                } else if key == t {
                    if rank < j {
                        xh = qh;
                        xl = ql;
                    }
                    rank += 1u32;
                }
                let (nh, nl) = mass_add(cum_h, cum_l, xh, xl);
                if !done && mass_lt(uh, ul, nh, nl) {
                    pick[4] = i as u32;
                    done = true;
                }
                cum_h = nh;
                cum_l = nl;
            }
        }
    }
    sync_cube();
    if u == 0 {
        out[row] = pick[4];
    }
}

/// Sets the bit of each row's token in that row's presence mask (tokens outside the vocabulary
/// are ignored, as the host penalty ignores them).
#[cube(launch_unchecked)]
pub(crate) fn presence_mark_kernel(
    tokens: &[u32],
    presence: &mut [u32],
    rows: usize,
    vocab: usize,
    words: usize,
) {
    let row = ABSOLUTE_POS;
    if row >= rows {
        terminate!();
    }
    let t = tokens[row] as usize;
    if t < vocab {
        let w = row * words + t / 32;
        presence[w] |= 1u32 << (t % 32) as u32;
    }
}
