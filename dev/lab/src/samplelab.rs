//! Timing of `ops::sampling` against what it replaces, on one row (and four) of Qwen2's 151,936
//! logits (randn x 3, a spread like a language model's):
//!
//! - `argmax ...`: the greedy step's device argmax, the baseline sampling is compared with;
//! - `logits to host ...`: the old sampled path's copy of the logits to the host (a read, so
//!   every call waits for it; the host sort came on top);
//! - `sample <params> ...`: the sampling kernels (the presence mark included where the penalty
//!   is on, in the draw's first kernel as the decode step marks it), eagerly and, on CUDA,
//!   replayed from a captured graph (`graph`), as the sampled decode step runs them; where the
//!   small-top-k plan serves the parameters, on both plans (`small-k`, `radix`).
//!
//! `lab [--runtime cuda] samplelab [FILTER]` prints them as JSON lines (`cubellm bench`'s
//! format: `us` per call, `us_steady` per call in steady state).

use bench::{capture, randn_tensor, Case};
use cubecl::prelude::*;
use ops::sampling::{
    mark_and_sample_into, sample_into, small_top_k_serves, RowParams, SamplingInputs, SamplingPlan,
    SamplingWorkspace,
};
use ops::{caps, DType, DeviceTensor};

const VOCAB: usize = 151_936;

fn params() -> Vec<(&'static str, RowParams)> {
    let p = |temperature, top_k, top_p, repetition_penalty| RowParams {
        temperature,
        top_k,
        top_p,
        repetition_penalty,
    };
    vec![
        ("greedy+penalty1.1", p(0.0, 0, 1.0, 1.1)),
        ("t0.7", p(0.7, 0, 1.0, 1.0)),
        ("t0.7 k50", p(0.7, 50, 1.0, 1.0)),
        ("t0.7 p0.95", p(0.7, 0, 0.95, 1.0)),
        ("t0.7 k50 p0.95", p(0.7, 50, 0.95, 1.0)),
        ("t0.7 p0.95 penalty1.1", p(0.7, 0, 0.95, 1.1)),
        ("t0.7 k50 p0.95 penalty1.1", p(0.7, 50, 0.95, 1.1)),
    ]
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        for rows in [1usize, 4] {
            let suffix = format!("{rows}x{VOCAB} {dtype}");
            let logits = randn_tensor(client, &[rows, VOCAB], dtype, 3.0, 7);
            let bytes = (rows * VOCAB * dtype.size()) as f64;
            {
                let (x, o) = (
                    logits.clone(),
                    DeviceTensor::empty(client, &[rows], DType::U32),
                );
                out.push(Case {
                    name: format!("argmax {suffix}"),
                    dtype,
                    bytes,
                    flops: 0.0,
                    run: Box::new(move || ops::argmax::argmax_into(client, &x, &o).unwrap()),
                });
            }
            {
                let x = logits.clone();
                out.push(Case {
                    name: format!("logits to host {suffix}"),
                    dtype,
                    bytes,
                    flops: 0.0,
                    run: Box::new(move || {
                        std::hint::black_box(x.to_f32_vec(client).unwrap());
                    }),
                });
            }
            let plans = |p: RowParams| {
                let plan = SamplingPlan::for_params(&vec![p; rows], VOCAB);
                if small_top_k_serves(&vec![p; rows], VOCAB) {
                    let on = |small_k| SamplingPlan { small_k, ..plan };
                    vec![(" small-k", on(true)), (" radix", on(false))]
                } else {
                    vec![("", plan)]
                }
            };
            for (label, p, (plan_label, plan)) in params()
                .into_iter()
                .flat_map(|(l, p)| plans(p).into_iter().map(move |q| (l, p, q)))
            {
                let label = format!("{label}{plan_label}");
                let mut inputs = SamplingInputs::new(client, rows, VOCAB).unwrap();
                inputs.write_params(client, &vec![p; rows]).unwrap();
                inputs.set_plan(plan).unwrap();
                inputs.write_uniforms(client, &vec![0.37; rows]).unwrap();
                let context: Vec<u32> = (0..512u32).map(|i| i * 97 % VOCAB as u32).collect();
                inputs
                    .fill_presence(client, &vec![&context[..]; rows])
                    .unwrap();
                let workspace = SamplingWorkspace::new(client, rows, VOCAB).unwrap();
                let tokens = DeviceTensor::from_slice(client, &vec![5u32; rows], &[rows]).unwrap();
                let o = DeviceTensor::empty(client, &[rows], DType::U32);
                let x = logits.clone();
                let penalty = p.repetition_penalty != 1.0;
                let step = move || {
                    if penalty {
                        mark_and_sample_into(client, &tokens, &x, &inputs, &workspace, &o).unwrap();
                    } else {
                        sample_into(client, &x, &inputs, &workspace, &o).unwrap();
                    }
                };
                if let Some(graph) = capture(client, &step) {
                    out.push(Case {
                        name: format!("sample {label} graph {suffix}"),
                        dtype,
                        bytes,
                        flops: 0.0,
                        // SAFETY: the graph's retained handles keep its buffers alive.
                        run: Box::new(move || unsafe { graph.replay() }),
                    });
                }
                out.push(Case {
                    name: format!("sample {label} {suffix}"),
                    dtype,
                    bytes,
                    flops: 0.0,
                    run: Box::new(step),
                });
            }
        }
    }
    out
}
