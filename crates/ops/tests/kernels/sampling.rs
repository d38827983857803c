//! Device sampling against the f64 reference.
//!
//! The tolerance rule: the device computes the weights in f32 and sums them in fixed point
//! (about 2^-35 of the maximum's weight per unit), the reference in f64. So the device's token
//! `d` must be one the reference keeps, and `u` must fall in `d`'s interval
//! `[cumulative before d, cumulative after d)` of the reference's draw, widened by `TOL` on each
//! side: it equals the reference's choice unless `u` is within `TOL` of a boundary of the
//! cumulative distribution. Where top-p's decision itself is within `TOL` of flipping (the
//! reference's `top_p_margin`), `d` need only be kept by top-p at `top_p + TOL`. The test counts
//! the draws decided by the strict rule and requires most of them to be.

use cubecl::prelude::*;
use ops::reference::sampling as reference;
use ops::sampling::{
    mark_and_sample_into, presence_mark_into, sample, sample_into, small_top_k_limit, RowParams,
    SamplingInputs, SamplingPlan, SamplingWorkspace,
};
use ops::{DType, DeviceTensor};
use rand::Rng;
use testkit::*;

const TOL: f64 = 2e-5;

const UNIFORMS: [f64; 8] = [0.0, 1e-9, 0.013, 0.3, 0.5, 0.77, 0.999_999, 1.0 - 1e-12];

/// Parameter rows of one launch. `family` picks its `SamplingPlan`: the radix plan with both
/// searches, top-k only, top-p only, neither; the small-top-k plan with and without top-p.
fn param_grid(vocab: usize, family: usize) -> Vec<RowParams> {
    let small = small_top_k_limit(vocab) as u32;
    let small_ks = [1, 2, 5, 50.min(small), small];
    let ks: &[u32] = match family % 6 {
        0 | 1 => &[0, 1, 5, 50, vocab as u32 + 10],
        2 | 3 => &[0, 1],
        _ => &small_ks,
    };
    let ps: &[f32] = if family.is_multiple_of(2) {
        &[1.0, 0.9, 0.5, 1e-6]
    } else {
        &[1.0]
    };
    let mut out = Vec::new();
    for &temperature in &[0.0f32, 0.7, 1.0, 1.6] {
        for &top_k in ks {
            for &top_p in ps {
                for &repetition_penalty in &[1.0f32, 1.3] {
                    out.push(RowParams {
                        temperature,
                        top_k,
                        top_p,
                        repetition_penalty,
                    });
                }
            }
        }
    }
    out
}

/// One row's logits, of a kind picked by `kind`: plain random, peaked, all equal, a tied
/// maximum, with `-inf` and NaN entries, with `+inf` entries.
fn row_logits(rng: &mut rand::rngs::StdRng, vocab: usize, kind: usize) -> Vec<f32> {
    let mut v = random(rng, vocab, 6.0);
    match kind % 8 {
        1 => v.iter_mut().for_each(|x| *x *= 4.0),
        2 => v.iter_mut().for_each(|x| *x = 1.25),
        3 if vocab > 3 => {
            let m = v.iter().cloned().fold(f32::MIN, f32::max) + 0.5;
            v[vocab / 3] = m;
            v[vocab - 1] = m;
            v[1] = m;
        }
        4 => {
            for (i, x) in v.iter_mut().enumerate() {
                if i % 3 != 1 {
                    *x = f32::NEG_INFINITY;
                }
            }
            if vocab > 5 {
                v[vocab - 2] = f32::NAN;
            }
        }
        5 if vocab > 2 => {
            v[vocab / 2] = f32::INFINITY;
            v[vocab - 1] = f32::INFINITY;
        }
        6 => {
            // Only a few distinct values: many ties everywhere.
            v.iter_mut().for_each(|x| *x = (*x).round() / 2.0);
        }
        _ => {}
    }
    v
}

struct Checked {
    strict: usize,
    loose: usize,
}

/// Checks the device's token for one row against the reference (see the module docs).
fn check_row(
    what: &str,
    logits: &[f64],
    present: &[bool],
    p: RowParams,
    u: f64,
    got: u32,
    counts: &mut Checked,
) {
    let kept = reference::kept(logits, present, p);
    if kept.ids.is_empty() {
        assert_eq!(
            got,
            u32::MAX,
            "{what}: no candidate, yet the device chose {got}"
        );
        return;
    }
    assert!(
        (got as usize) < logits.len(),
        "{what}: the device chose {got} of {} (u {u}, {p:?})",
        logits.len()
    );
    if kept.top_p_margin > TOL {
        let (before, after) = kept.interval(got).unwrap_or_else(|| {
            panic!(
                "{what}: the device chose {got}, not kept by the reference {:?}.. (u {u}, {p:?})",
                &kept.ids[..kept.ids.len().min(8)]
            )
        });
        assert!(
            before - TOL <= u && u < after + TOL,
            "{what}: the device chose {got} (interval [{before}, {after})), the reference {:?} for u {u} ({p:?})",
            kept.choose(u)
        );
        counts.strict += 1;
    } else {
        let loose = RowParams {
            top_p: (p.top_p as f64 + TOL).min(1.0) as f32,
            ..p
        };
        let wide = reference::kept(logits, present, loose);
        assert!(
            wide.ids.binary_search(&got).is_ok(),
            "{what}: the device chose {got}, not kept even at top_p + {TOL} ({p:?})"
        );
        counts.loose += 1;
    }
}

fn sampling_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(77);
    let mut counts = Checked {
        strict: 0,
        loose: 0,
    };
    for dtype in float_dtypes(client) {
        // Every launch of a size has its own family of parameters (see `param_grid`).
        for &(vocab, rows, launches) in &[
            (1usize, 8usize, 6usize),
            (3, 64, 8),
            (17, 160, 6),
            (1000, 160, 6),
            (4099, 24, 6),
            (4099, 16, 2),
            (151_936, 4, 6),
            // One row, as a decode step draws.
            (151_936, 1, 8),
            // More cubes than the draw's units: each unit of the draw scans several cubes.
            (300_007, 2, 6),
        ] {
            let mut inputs = SamplingInputs::new(client, rows, vocab).unwrap();
            let workspace = SamplingWorkspace::new(client, rows, vocab).unwrap();
            for launch in 0..launches {
                let grid = param_grid(vocab, launch);
                let mut values = Vec::with_capacity(rows * vocab);
                let mut params = Vec::with_capacity(rows);
                let mut uniforms = Vec::with_capacity(rows);
                let mut contexts = Vec::with_capacity(rows);
                for r in 0..rows {
                    let at = launch * rows + r;
                    values.extend(row_logits(&mut rng, vocab, at));
                    params.push(grid[(at * 7) % grid.len()]);
                    uniforms.push(UNIFORMS[(at * 3 + at / grid.len()) % UNIFORMS.len()]);
                    // Ids of a context (some outside the vocabulary, which are ignored).
                    let n = rng.random_range(0..=vocab.min(64));
                    contexts.push(
                        (0..n)
                            .map(|_| rng.random_range(0..vocab as u32 + 3))
                            .collect::<Vec<u32>>(),
                    );
                }
                let (x, xh) = upload(client, &values, &[rows, vocab], dtype);
                inputs.write_params(client, &params).unwrap();
                // The family's plan, whichever `write_params` chose.
                let plan = SamplingPlan {
                    small_k: launch % 6 >= 4,
                    ..inputs.plan()
                };
                inputs.set_plan(plan).unwrap();
                inputs.write_uniforms(client, &uniforms).unwrap();
                let ctx: Vec<&[u32]> = contexts.iter().map(Vec::as_slice).collect();
                inputs.fill_presence(client, &ctx).unwrap();
                let out = DeviceTensor::from_slice(client, &vec![7u32; rows], &[rows]).unwrap();
                sample_into(client, &x, &inputs, &workspace, &out).unwrap();
                let got = out.to_vec::<u32>(client).unwrap();
                // Deterministic: the same inputs give the same tokens.
                sample_into(client, &x, &inputs, &workspace, &out).unwrap();
                assert_exact(
                    &format!("sample twice {dtype} V={vocab}"),
                    &out.to_vec::<u32>(client).unwrap(),
                    &got,
                );
                for r in 0..rows {
                    let mut present = vec![false; vocab];
                    for &id in &contexts[r] {
                        if (id as usize) < vocab {
                            present[id as usize] = true;
                        }
                    }
                    check_row(
                        &format!("{dtype} V={vocab} row {r}"),
                        &xh[r * vocab..(r + 1) * vocab],
                        &present,
                        params[r],
                        uniforms[r],
                        got[r],
                        &mut counts,
                    );
                }
            }
        }
    }
    eprintln!(
        "{} draws checked strictly, {} loosely",
        counts.strict, counts.loose
    );
    assert!(
        counts.strict > 20 * counts.loose.max(1),
        "too few draws checked strictly: {} strict, {} loose",
        counts.strict,
        counts.loose
    );
}

/// Hand-made rows whose answer is known without the reference.
fn exact_cases_case<R: Runtime>(client: &ComputeClient<R>) {
    let p = |temperature: f32, top_k: u32, top_p: f32, repetition_penalty: f32| RowParams {
        temperature,
        top_k,
        top_p,
        repetition_penalty,
    };
    let ninf = f32::NEG_INFINITY;
    // (logits, context, params, u, token)
    type Case = (Vec<f32>, Vec<u32>, RowParams, f64, u32);
    let cases: Vec<Case> = vec![
        // Greedy: the first maximum.
        (
            vec![1.0, 3.0, 3.0, 2.0],
            vec![],
            p(0.0, 0, 1.0, 1.0),
            0.5,
            1,
        ),
        // Greedy after the penalty: 3.0 / 2 falls below 2.0.
        (
            vec![1.0, 3.0, 0.0, 2.0],
            vec![1],
            p(0.0, 0, 1.0, 2.0),
            0.5,
            3,
        ),
        // A negative logit is multiplied: -1 * 3 = -3 < -2.
        (vec![-1.0, -2.0], vec![0, 0, 0], p(0.0, 0, 1.0, 3.0), 0.9, 1),
        // Top-k 1 is greedy whatever u.
        (vec![0.5, 0.4, 0.6], vec![], p(1.0, 1, 1.0, 1.0), 0.999, 2),
        // Four equal logits: a quarter each, drawn in id order.
        (vec![2.0; 4], vec![], p(1.0, 0, 1.0, 1.0), 0.0, 0),
        (vec![2.0; 4], vec![], p(1.0, 0, 1.0, 1.0), 0.26, 1),
        (vec![2.0; 4], vec![], p(1.0, 0, 1.0, 1.0), 0.74, 2),
        (vec![2.0; 4], vec![], p(1.0, 0, 1.0, 1.0), 0.76, 3),
        // Top-k 2 of four equal logits keeps ids 0 and 1.
        (vec![2.0; 4], vec![], p(1.0, 2, 1.0, 1.0), 0.99, 1),
        // Top-p 0.5 of four equal logits keeps ids 0 and 1 (cumulative 0.5 reaches it).
        (vec![2.0; 4], vec![], p(1.0, 0, 0.5, 1.0), 0.99, 1),
        // Top-p 0.51 needs a third.
        (vec![2.0; 4], vec![], p(1.0, 0, 0.51, 1.0), 0.99, 2),
        // A tiny top-p keeps only the maximum.
        (vec![0.1, 0.3, 0.2], vec![], p(1.0, 0, 1e-6, 1.0), 0.99, 1),
        // -inf is never chosen, even at u near 1.
        (
            vec![ninf, 0.0, ninf, 0.0, ninf],
            vec![],
            p(1.0, 0, 1.0, 1.0),
            0.999_999,
            3,
        ),
        (
            vec![ninf, 5.0, ninf],
            vec![],
            p(2.0, 0, 1.0, 1.0),
            0.999_999,
            1,
        ),
        // NaN is skipped.
        (
            vec![f32::NAN, 0.0, f32::NAN],
            vec![],
            p(1.0, 0, 1.0, 1.0),
            0.9,
            1,
        ),
        // Only -inf: no candidate.
        (vec![ninf; 3], vec![], p(1.0, 0, 1.0, 1.0), 0.5, u32::MAX),
        (vec![ninf; 3], vec![], p(0.0, 0, 1.0, 1.0), 0.5, u32::MAX),
        // Top-k larger than the vocabulary keeps all (here with -inf among them).
        (vec![0.0, ninf, 0.0], vec![], p(1.0, 100, 1.0, 1.0), 0.6, 2),
    ];
    for dtype in float_dtypes(client) {
        for (i, (logits, context, params, u, want)) in cases.iter().enumerate() {
            let vocab = logits.len();
            let mut inputs = SamplingInputs::new(client, 1, vocab).unwrap();
            inputs.write_params(client, &[*params]).unwrap();
            inputs.write_uniforms(client, &[*u]).unwrap();
            inputs.fill_presence(client, &[context]).unwrap();
            let x = DeviceTensor::from_f32(client, logits, &[1, vocab], dtype).unwrap();
            let got = sample(client, &x, &inputs)
                .unwrap()
                .to_vec::<u32>(client)
                .unwrap();
            assert_eq!(
                got,
                vec![*want],
                "case {i} {dtype}: {logits:?} {params:?} u {u}"
            );
            let present: Vec<bool> = (0..vocab).map(|t| context.contains(&(t as u32))).collect();
            let xh: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
            let want_ref = reference::sample(&xh, &present, *params, *u).unwrap_or(u32::MAX);
            assert_eq!(want_ref, *want, "case {i}: the reference disagrees");
        }
    }
}

/// The device mark adds each row's token to its mask, as a context refill would.
fn presence_case<R: Runtime>(client: &ComputeClient<R>) {
    let (rows, vocab) = (3, 100);
    let mut inputs = SamplingInputs::new(client, rows, vocab).unwrap();
    let contexts: [&[u32]; 3] = [&[1, 2, 99], &[], &[64, 500]];
    inputs.fill_presence(client, &contexts).unwrap();
    let tokens = DeviceTensor::from_slice(client, &[33u32, 0, 1000], &[rows]).unwrap();
    presence_mark_into(client, &tokens, &inputs).unwrap();
    let words = vocab.div_ceil(32);
    let mut want = vec![0u32; rows * words];
    for (r, ids) in [&[1u32, 2, 99, 33][..], &[0], &[64]].iter().enumerate() {
        for &i in ids.iter() {
            want[r * words + i as usize / 32] |= 1 << (i % 32);
        }
    }
    assert_exact(
        "presence mask",
        &inputs.presence.to_vec::<u32>(client).unwrap(),
        &want,
    );
    // The marked token is penalised: greedy moves from token 33 to token 34.
    let mut logits = vec![0f32; rows * vocab];
    logits[33] = 5.0;
    logits[34] = 4.0;
    let x = DeviceTensor::from_f32(client, &logits, &[rows, vocab], DType::F32).unwrap();
    let greedy = RowParams {
        repetition_penalty: 2.0,
        ..RowParams::GREEDY
    };
    inputs.write_params(client, &[greedy; 3]).unwrap();
    let got = sample(client, &x, &inputs)
        .unwrap()
        .to_vec::<u32>(client)
        .unwrap();
    assert_eq!(got[0], 34);
}

/// The draw that marks the step's token itself gives the tokens and the mask of the mark then
/// the draw, on awkward vocabularies (the marked ids in the first, a middle and the last cube,
/// one outside the vocabulary) and parameters with and without the penalty; and a marked
/// token is penalised in the same draw.
fn mark_in_draw_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(78);
    let sampled = |penalty: f32, top_k: u32, top_p: f32| RowParams {
        temperature: 0.8,
        top_k,
        top_p,
        repetition_penalty: penalty,
    };
    let settings = [
        sampled(1.3, 50, 0.9),
        sampled(1.0, 0, 0.95),
        sampled(1.1, 0, 1.0),
        RowParams {
            repetition_penalty: 2.0,
            ..RowParams::GREEDY
        },
    ];
    for &(vocab, tokens) in &[
        (1000usize, [3u32, 999, 1000]),
        (4099, [0, 2050, 4098]),
        (151_936, [151_935, 77_000, 5]),
    ] {
        let rows = tokens.len();
        let values: Vec<f32> = (0..rows)
            .flat_map(|r| row_logits(&mut rng, vocab, r))
            .collect();
        let x = DeviceTensor::from_f32(client, &values, &[rows, vocab], DType::F32).unwrap();
        let ids = DeviceTensor::from_slice(client, &tokens, &[rows]).unwrap();
        let contexts: Vec<Vec<u32>> = (0..rows)
            .map(|_| (0..40).map(|_| rng.random_range(0..vocab as u32)).collect())
            .collect();
        let ctx: Vec<&[u32]> = contexts.iter().map(Vec::as_slice).collect();
        let workspace = SamplingWorkspace::new(client, rows, vocab).unwrap();
        for params in settings {
            let u: Vec<f64> = (0..rows).map(|r| UNIFORMS[(r * 3 + 2) % 8]).collect();
            let run = |fused: bool| {
                let mut inputs = SamplingInputs::new(client, rows, vocab).unwrap();
                inputs.write_params(client, &vec![params; rows]).unwrap();
                inputs.write_uniforms(client, &u).unwrap();
                inputs.fill_presence(client, &ctx).unwrap();
                let out = DeviceTensor::from_slice(client, &vec![7u32; rows], &[rows]).unwrap();
                if fused {
                    mark_and_sample_into(client, &ids, &x, &inputs, &workspace, &out).unwrap();
                } else {
                    presence_mark_into(client, &ids, &inputs).unwrap();
                    sample_into(client, &x, &inputs, &workspace, &out).unwrap();
                }
                let mask = inputs.presence.to_vec::<u32>(client).unwrap();
                (out.to_vec::<u32>(client).unwrap(), mask)
            };
            let (want, want_mask) = run(false);
            let (got, got_mask) = run(true);
            let what = format!("V={vocab} {params:?}");
            assert_exact(&format!("tokens {what}"), &got, &want);
            assert_exact(&format!("mask {what}"), &got_mask, &want_mask);
        }
    }
    // Greedy with the penalty moves from the marked token 33 to token 34.
    let vocab = 2100;
    let mut logits = vec![0f32; vocab];
    logits[33] = 5.0;
    logits[34] = 4.0;
    let x = DeviceTensor::from_f32(client, &logits, &[1, vocab], DType::F32).unwrap();
    let mut inputs = SamplingInputs::new(client, 1, vocab).unwrap();
    inputs.write_params(client, &[settings[3]]).unwrap();
    let ids = DeviceTensor::from_slice(client, &[33u32], &[1]).unwrap();
    let workspace = SamplingWorkspace::new(client, 1, vocab).unwrap();
    let out = DeviceTensor::from_slice(client, &[7u32], &[1]).unwrap();
    mark_and_sample_into(client, &ids, &x, &inputs, &workspace, &out).unwrap();
    assert_eq!(out.to_vec::<u32>(client).unwrap(), [34]);
}

/// The small-top-k plan draws the tokens of the radix plan, exactly: on every kind of row (ties
/// everywhere, a tied maximum, `-inf`, NaN and `+inf` entries), with top-k from 2 to the plan's
/// limit, with and without top-p and the penalty, greedy rows among them, on vocabularies of
/// one chunk, of a partial last chunk and of many chunks, in every float dtype (the radix
/// plan's searches take fewer passes over f16 and bf16 logits without the penalty).
fn small_k_matches_radix_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(79);
    let sizes = [(5usize, 16usize), (2049, 24), (151_936, 8), (300_007, 3)];
    for (dtype, &(vocab, rows)) in float_dtypes(client)
        .into_iter()
        .flat_map(|d| sizes.iter().map(move |s| (d, s)))
    {
        let limit = small_top_k_limit(vocab) as u32;
        let mut inputs = SamplingInputs::new(client, rows, vocab).unwrap();
        let workspace = SamplingWorkspace::new(client, rows, vocab).unwrap();
        for round in 0..3 {
            let values: Vec<f32> = (0..rows)
                .flat_map(|r| row_logits(&mut rng, vocab, r + round))
                .collect();
            let (x, _) = upload(client, &values, &[rows, vocab], dtype);
            let params: Vec<RowParams> = (0..rows)
                .map(|r| RowParams {
                    temperature: [0.7, 1.0, 0.0, 1.6][(r + round) % 4],
                    top_k: [2, limit, 50.min(limit), 7, 1][(r + 2 * round) % 5],
                    top_p: [1.0, 0.9, 0.3, 1e-6][(r / 2 + round) % 4],
                    // The first round without the penalty (the radix plan's fewest passes).
                    repetition_penalty: [1.0, 1.3][(r + round) % 2 * round.min(1)],
                })
                .collect();
            let uniforms: Vec<f64> = (0..rows)
                .map(|r| UNIFORMS[(r * 5 + round) % UNIFORMS.len()])
                .collect();
            let contexts: Vec<Vec<u32>> = (0..rows)
                .map(|_| (0..30).map(|_| rng.random_range(0..vocab as u32)).collect())
                .collect();
            let ctx: Vec<&[u32]> = contexts.iter().map(Vec::as_slice).collect();
            inputs.write_params(client, &params).unwrap();
            inputs.write_uniforms(client, &uniforms).unwrap();
            inputs.fill_presence(client, &ctx).unwrap();
            let small = SamplingPlan {
                small_k: true,
                ..inputs.plan()
            };
            inputs.set_plan(small).unwrap();
            let draw = |inputs: &SamplingInputs<R>| {
                let out = DeviceTensor::from_slice(client, &vec![7u32; rows], &[rows]).unwrap();
                sample_into(client, &x, inputs, &workspace, &out).unwrap();
                out.to_vec::<u32>(client).unwrap()
            };
            let got = draw(&inputs);
            inputs
                .set_plan(SamplingPlan {
                    small_k: false,
                    ..small
                })
                .unwrap();
            let want = draw(&inputs);
            assert_exact(
                &format!("small-k vs radix {dtype} V={vocab} round {round}"),
                &got,
                &want,
            );
        }
        // Top-k alone runs the radix plan, and the small one on request.
        let alone = RowParams {
            temperature: 1.0,
            top_k: 2,
            top_p: 1.0,
            repetition_penalty: 1.0,
        };
        inputs.write_params(client, &vec![alone; rows]).unwrap();
        assert!(!inputs.plan().small_k);
        inputs
            .set_plan(SamplingPlan {
                small_k: true,
                ..inputs.plan()
            })
            .unwrap();
        // A top-k past the limit needs the radix plan.
        let wide = RowParams {
            temperature: 1.0,
            top_k: limit + 1,
            top_p: 1.0,
            repetition_penalty: 1.0,
        };
        if (limit as usize) < vocab {
            inputs.write_params(client, &vec![wide; rows]).unwrap();
            assert!(!inputs.plan().small_k);
            assert_err(
                "small-k plan past its limit",
                inputs.set_plan(SamplingPlan {
                    small_k: true,
                    ..inputs.plan()
                }),
                "argument",
            );
        }
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut inputs = SamplingInputs::new(client, 2, 10).unwrap();
    let workspace = SamplingWorkspace::new(client, 2, 10).unwrap();
    let out = DeviceTensor::empty(client, &[2], DType::U32);
    let x = DeviceTensor::from_f32(client, &[0.0; 20], &[2, 10], DType::F32).unwrap();
    sample_into(client, &x, &inputs, &workspace, &out).unwrap();
    let wide = DeviceTensor::from_f32(client, &[0.0; 22], &[2, 11], DType::F32).unwrap();
    assert_err(
        "vocab",
        sample_into(client, &wide, &inputs, &workspace, &out),
        "shape",
    );
    let three = DeviceTensor::from_f32(client, &[0.0; 30], &[3, 10], DType::F32).unwrap();
    assert_err(
        "rows",
        sample_into(client, &three, &inputs, &workspace, &out),
        "shape",
    );
    let other_ws = SamplingWorkspace::new(client, 1, 10).unwrap();
    assert_err(
        "workspace",
        sample_into(client, &x, &inputs, &other_ws, &out),
        "shape",
    );
    let bad_out = DeviceTensor::empty(client, &[2], DType::F32);
    assert_err(
        "out dtype",
        sample_into(client, &x, &inputs, &workspace, &bad_out),
        "shape",
    );
    let short_out = DeviceTensor::empty(client, &[1], DType::U32);
    assert_err(
        "out len",
        sample_into(client, &x, &inputs, &workspace, &short_out),
        "shape",
    );
    let ids = DeviceTensor::from_slice(client, &[0u32; 20], &[2, 10]).unwrap();
    assert_err("int logits", sample(client, &ids, &inputs), "dtype");
    if !ops::caps::supports_dtype(client, DType::BF16) {
        let bf16 = DeviceTensor::from_f32(client, &[0.0; 20], &[2, 10], DType::BF16).unwrap();
        assert_err("bf16", sample(client, &bf16, &inputs), "dtype");
    }
    let g = RowParams::GREEDY;
    for bad in [
        RowParams {
            temperature: -1.0,
            ..g
        },
        RowParams {
            temperature: f32::NAN,
            ..g
        },
        RowParams { top_p: 0.0, ..g },
        RowParams { top_p: 1.5, ..g },
        RowParams {
            repetition_penalty: 0.0,
            ..g
        },
        RowParams {
            repetition_penalty: f32::INFINITY,
            ..g
        },
    ] {
        assert_err("params", inputs.write_params(client, &[g, bad]), "argument");
    }
    assert_err("params rows", inputs.write_params(client, &[g]), "shape");
    assert_err(
        "uniform 1",
        inputs.write_uniforms(client, &[0.0, 1.0]),
        "argument",
    );
    assert_err(
        "uniform < 0",
        inputs.write_uniforms(client, &[-0.1, 0.0]),
        "argument",
    );
    assert_err(
        "uniform NaN",
        inputs.write_uniforms(client, &[f64::NAN, 0.0]),
        "argument",
    );
    assert_err(
        "uniform rows",
        inputs.write_uniforms(client, &[0.0]),
        "shape",
    );
    assert_err("contexts", inputs.fill_presence(client, &[&[1]]), "shape");
    assert_err(
        "no rows",
        SamplingInputs::new(client, 0, 10).map(|_| ()),
        "argument",
    );
    assert_err(
        "vocab too large",
        SamplingWorkspace::new(client, 1, ops::sampling::MAX_VOCAB + 1).map(|_| ()),
        "argument",
    );
    let bad_tokens = DeviceTensor::from_slice(client, &[0u32; 3], &[3]).unwrap();
    assert_err(
        "mark rows",
        presence_mark_into(client, &bad_tokens, &inputs),
        "shape",
    );
    assert_err(
        "mark and draw rows",
        mark_and_sample_into(client, &bad_tokens, &x, &inputs, &workspace, &out),
        "shape",
    );
}

#[test]
fn sampling_matches_reference() {
    on_each_runtime!(sampling_case);
}

#[test]
fn sampling_exact_cases() {
    on_each_runtime!(exact_cases_case);
}

#[test]
fn sampling_presence_mask() {
    on_each_runtime!(presence_case);
}

#[test]
fn sampling_marks_the_token_in_the_draw() {
    on_each_runtime!(mark_in_draw_case);
}

#[test]
fn sampling_small_k_plan_matches_radix_plan() {
    on_each_runtime!(small_k_matches_radix_case);
}

#[test]
fn sampling_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
