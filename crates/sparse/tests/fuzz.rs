//! Bounded, seeded fuzzing of the host-side BSR checks: `validate_bsr` over random and mutated
//! `crow_indices` / `col_indices` / value counts / shapes / block sizes, and `build_work_items`
//! over random `crow_indices` (host only: `Bsr::from_raw` runs exactly `validate_bsr` before it
//! touches the device).
//!
//! Every case must return (no panic, checked under `catch_unwind`; no allocation above 256 MiB,
//! refused by this binary's allocator; no hang). `validate_bsr` must agree with an independent
//! checker written here with checked arithmetic (Ok exactly for valid BSR), and the work list of
//! a valid pattern must cover every block-row's blocks exactly once; an invalid pattern gives an
//! empty list.
//!
//! Cases per target: 2000 by default (well under a second each in a debug build);
//! `CUBELLM_FUZZ_ITERS=N` runs N per target, `CUBELLM_FUZZ_SEED=S` replays the case of seed `S`
//! that a failure names.

use rand::Rng;
use sparse::bsr::{build_work_items, WorkItems};
use sparse::{validate_bsr, SparseError};
use testkit::fuzz::{run, run_case};

// --- harness ------------------------------------------------------------------------------------

// The fuzz allocator of `testkit::fuzz`: refuses single allocations above `ALLOC_CAP` in case
// threads (a `#[global_allocator]` has to be declared in each test binary).
#[global_allocator]
static ALLOC: testkit::fuzz::CappedAlloc = testkit::fuzz::CappedAlloc;

// --- inputs -------------------------------------------------------------------------------------

/// Raw BSR arrays and what they claim to be.
#[derive(Debug, Clone)]
struct Raw {
    crow: Vec<i32>,
    col: Vec<i32>,
    values_len: usize,
    shape: [usize; 2],
    block: usize,
}

/// A valid random BSR pattern: up to 12 x 12 blocks of a small block size.
fn valid(rng: &mut impl Rng) -> Raw {
    let block = [1, 2, 4, 16][rng.random_range(0..4)];
    let (rows, cols) = (rng.random_range(1..12), rng.random_range(1..12));
    let density = rng.random_range(0.0..=1.0);
    let mut crow = vec![0i32];
    let mut col = Vec::new();
    for _ in 0..rows {
        for c in 0..cols {
            if rng.random_bool(density) {
                col.push(c as i32);
            }
        }
        crow.push(col.len() as i32);
    }
    let values_len = col.len() * block * block;
    Raw {
        crow,
        col,
        values_len,
        shape: [rows * block, cols * block],
        block,
    }
}

fn edge_i32(rng: &mut impl Rng) -> i32 {
    [
        0,
        1,
        -1,
        i32::MAX,
        i32::MIN,
        i32::MAX - 1,
        rng.random_range(-20..20),
    ][rng.random_range(0..7)]
}

fn edge_usize(rng: &mut impl Rng) -> usize {
    [
        0,
        1,
        3,
        usize::MAX,
        usize::MAX / 2 + 1,
        1 << 32,
        1 << 33,
        rng.random_range(0..64),
    ][rng.random_range(0..8)]
}

/// A valid pattern with one to three things broken (or a completely random one).
fn mutated(rng: &mut impl Rng) -> Raw {
    let mut r = valid(rng);
    if rng.random_bool(0.1) {
        let n = rng.random_range(0..8);
        r.crow = (0..n).map(|_| edge_i32(rng)).collect();
        r.col = (0..rng.random_range(0..8)).map(|_| edge_i32(rng)).collect();
    }
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..12) {
            0 if !r.crow.is_empty() => {
                let i = rng.random_range(0..r.crow.len());
                r.crow[i] = edge_i32(rng);
            }
            1 if !r.col.is_empty() => {
                let i = rng.random_range(0..r.col.len());
                r.col[i] = edge_i32(rng);
            }
            2 if r.col.len() > 1 => {
                let i = rng.random_range(0..r.col.len() - 1);
                r.col.swap(i, i + 1);
            }
            3 if r.col.len() > 1 => {
                let i = rng.random_range(0..r.col.len() - 1);
                r.col[i + 1] = r.col[i];
            }
            4 => {
                r.crow.pop();
            }
            5 => r.crow.push(*r.crow.last().unwrap_or(&0)),
            6 => {
                r.col.pop();
            }
            7 => {
                r.values_len = [
                    r.values_len.saturating_add(1),
                    r.values_len.saturating_sub(1),
                    edge_usize(rng),
                ][rng.random_range(0..3)]
            }
            8 => r.block = edge_usize(rng),
            9 => r.shape[rng.random_range(0..2)] = edge_usize(rng),
            10 => {
                // Huge dimensions that are still whole blocks.
                let b = [1, 1 << 32, 1 << 31][rng.random_range(0..3)];
                r.block = b;
                r.shape = [
                    b.saturating_mul(r.crow.len().max(2) - 1),
                    usize::MAX / b * b,
                ];
            }
            _ if !r.crow.is_empty() => {
                let i = rng.random_range(0..r.crow.len());
                r.crow[i] = r.crow[i].wrapping_add(rng.random_range(-2..=2));
            }
            _ => {}
        }
    }
    r
}

// --- properties ---------------------------------------------------------------------------------

/// The BSR rules, checked independently of the crate with checked arithmetic.
fn reference_valid(r: &Raw) -> bool {
    let [n, k] = r.shape;
    let b = r.block;
    if b == 0 || n == 0 || k == 0 || n % b != 0 || k % b != 0 || n.checked_mul(k).is_none() {
        return false;
    }
    let (rows, cols) = (n / b, k / b);
    if r.crow.len().checked_sub(1) != Some(rows) || r.crow[0] != 0 {
        return false;
    }
    if r.crow.windows(2).any(|w| w[1] < w[0]) || *r.crow.last().unwrap() as usize != r.col.len() {
        return false;
    }
    if r.col.iter().any(|&c| c < 0 || c as usize >= cols) {
        return false;
    }
    let sorted = r.crow.windows(2).all(|w| {
        r.col[w[0] as usize..w[1] as usize]
            .windows(2)
            .all(|p| p[0] < p[1])
    });
    let expected = r.col.len().checked_mul(b).and_then(|v| v.checked_mul(b));
    sorted && expected == Some(r.values_len)
}

/// The work list of a valid `crow` covers each block-row's blocks exactly once, with slots that
/// match the splits; an invalid `crow` gives no work.
fn check_work(crow: &[i32], work: &WorkItems) -> Result<(), String> {
    let valid = crow.first().is_none_or(|&c| c == 0) && crow.windows(2).all(|w| w[0] <= w[1]);
    if !valid {
        return match work.items.is_empty() && work.splits.is_empty() && work.n_slots == 0 {
            true => Ok(()),
            false => Err(format!(
                "work for an invalid crow: {} items",
                work.items.len()
            )),
        };
    }
    let rows = crow.len().saturating_sub(1);
    let mut by_row: Vec<Vec<[i32; 4]>> = vec![Vec::new(); rows];
    for it in &work.items {
        let r = usize::try_from(it[0])
            .ok()
            .filter(|&r| r < rows)
            .ok_or(format!("item {it:?}"))?;
        by_row[r].push(*it);
    }
    for (r, items) in by_row.iter_mut().enumerate() {
        items.sort_by_key(|it| it[1]);
        let mut at = crow[r];
        for it in items.iter() {
            if it[1] != at || it[2] < it[1] {
                return Err(format!("row {r}: item {it:?} does not continue at {at}"));
            }
            at = it[2];
        }
        if at != crow[r + 1] || items.is_empty() {
            return Err(format!("row {r}: covered up to {at} of {}", crow[r + 1]));
        }
        let cut = work.splits.iter().find(|s| s[0] == r as i32);
        for it in items.iter() {
            let ok = match cut {
                None => it[3] == -1,
                Some(s) => s[1] <= it[3] && it[3] < s[1] + s[2],
            };
            if !ok {
                return Err(format!(
                    "row {r}: item {it:?} slot outside its split {cut:?}"
                ));
            }
        }
    }
    let slots: i64 = work.splits.iter().map(|s| s[2] as i64).sum();
    (slots == work.n_slots as i64)
        .then_some(())
        .ok_or_else(|| format!("{slots} slots in splits, n_slots {}", work.n_slots))
}

#[test]
fn validate_bsr_agrees_with_an_independent_checker_and_never_panics() {
    run("validate_bsr", 1, 2000, |rng| {
        let r = if rng.random_bool(0.2) {
            valid(rng)
        } else {
            mutated(rng)
        };
        let input = format!("{r:?}");
        (
            input,
            Box::new(move || {
                let result = validate_bsr(&r.crow, &r.col, r.values_len, r.shape, r.block);
                let want = reference_valid(&r);
                match (&result, want) {
                    (Ok(()), true) => check_work(&r.crow, &build_work_items(&r.crow)),
                    (Err(SparseError::Ops(_)) | Err(SparseError::Sparsity { .. }), _) => {
                        Err(format!("unexpected error {result:?}"))
                    }
                    (Err(e), false) => (!e.to_string().contains('\n'))
                        .then_some(())
                        .ok_or_else(|| "multi-line error".into()),
                    (r, want) => Err(format!(
                        "validate_bsr gives {r:?}, the reference says valid = {want}"
                    )),
                }
            }),
        )
    });
}

#[test]
fn build_work_items_of_random_crows_covers_valid_patterns_and_gives_nothing_for_invalid_ones() {
    run("build_work_items", 2, 2000, |rng| {
        let crow: Vec<i32> = match rng.random_range(0..4) {
            0 => (0..rng.random_range(0..10))
                .map(|_| edge_i32(rng))
                .collect(),
            1 => {
                // Valid, with rows of very different lengths (some get cut into chunks).
                let mut c = vec![0i32];
                for _ in 0..rng.random_range(0..40) {
                    let add = [0, 1, 3, 50, 1000, i32::MAX / 64][rng.random_range(0..6)];
                    c.push(c.last().unwrap().saturating_add(add));
                }
                c
            }
            _ => {
                let mut r = mutated(rng).crow;
                if rng.random_bool(0.5) && !r.is_empty() {
                    let i = rng.random_range(0..r.len());
                    r[i] = edge_i32(rng);
                }
                r
            }
        };
        let input = format!("crow {crow:?}");
        (
            input,
            Box::new(move || check_work(&crow, &build_work_items(&crow))),
        )
    });
}

/// Fixed inputs that panicked (arithmetic overflow) before the checks were made overflow-safe:
/// huge shapes and block sizes, and decreasing or negative `crow_indices` (`[-2, 5, 5]` found by
/// the fuzzer, seed 2000009); also a shape whose dense size overflows, now refused up front.
#[test]
fn overflowing_shapes_and_invalid_crows_are_errors_not_panics() {
    let cases = [
        Raw {
            crow: vec![0, 0],
            col: vec![],
            values_len: 0,
            shape: [usize::MAX, 1],
            block: 1,
        },
        Raw {
            crow: vec![0, 1],
            col: vec![0],
            values_len: 0,
            shape: [1 << 32, 1 << 32],
            block: 1 << 32,
        },
        Raw {
            crow: vec![0, 1, 2],
            col: vec![0, 0],
            values_len: 2,
            shape: [2, 1 << 63],
            block: 1,
        },
    ];
    for (i, r) in cases.into_iter().enumerate() {
        run_case(
            "validate-fixed",
            i as u64,
            format!("{r:?}"),
            Box::new(
                move || match validate_bsr(&r.crow, &r.col, r.values_len, r.shape, r.block) {
                    Err(_) => Ok(()),
                    Ok(()) => Err("accepted".into()),
                },
            ),
        );
    }
    for (i, crow) in [
        vec![-2, 5, 5],
        vec![0, 5, 2],
        vec![0, -1],
        vec![3, 1],
        vec![0, i32::MIN, 0],
        vec![0, i32::MAX, 0],
    ]
    .into_iter()
    .enumerate()
    {
        run_case(
            "work-fixed",
            i as u64,
            format!("crow {crow:?}"),
            Box::new(move || check_work(&crow, &build_work_items(&crow))),
        );
    }
}
