//! Sampling on the device through a session: each step's token against the f64 reference of
//! `ops::sampling` on the logits the session holds, the presence mask following the context,
//! the graph on CUDA, the host fallback, and the generator's text against the host sampler's.

use std::ops::ControlFlow;

use cubecl::prelude::*;
use model::sampling::Rng;
use model::{
    CausalLm, GenerateOptions, Generator, LoadOptions, Prompt, SamplingParams, Session,
    SessionOptions, Tokenizer,
};
use ops::caps;
use ops::reference::sampling as reference;
use testkit::on_each_runtime_one_cuda_at_a_time;

use crate::{load, Demo};

/// The ops tests' tolerance (see `crates/ops/tests/kernels/sampling.rs`).
const TOL: f64 = 2e-5;

fn params() -> Vec<SamplingParams> {
    let p = |temperature, top_k, top_p, repetition_penalty| SamplingParams {
        temperature,
        top_k,
        top_p,
        repetition_penalty,
        seed: 11,
    };
    vec![
        p(0.9, 0, 1.0, 1.0),
        p(0.7, 40, 0.9, 1.0),
        p(1.2, 0, 0.8, 1.3),
        // Greedy with the penalty: on the device too (the argmax alone cannot do it).
        p(0.0, 0, 1.0, 1.5),
    ]
}

/// Checks the device's token against the reference on `logits` (see the ops tests' rule).
fn check(what: &str, logits: &[f32], context: &[u32], p: &SamplingParams, u: f64, got: u32) {
    let mut present = vec![false; logits.len()];
    for &t in context {
        present[t as usize] = true;
    }
    let values: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    let kept = reference::kept(&values, &present, p.row_params());
    if kept.top_p_margin <= TOL {
        return;
    }
    let (before, after) = kept
        .interval(got)
        .unwrap_or_else(|| panic!("{what}: {got} is not kept ({p:?})"));
    assert!(
        before - TOL <= u && u < after + TOL,
        "{what}: chose {got} ([{before}, {after})), the reference {:?} for u {u} ({p:?})",
        kept.choose(u)
    );
}

fn demo_session<R: Runtime>(
    client: &ComputeClient<R>,
    demo: &Demo,
    options: SessionOptions,
) -> Session<R> {
    let (m, _) = load(
        client,
        &demo.0,
        &LoadOptions {
            max_len: Some(96),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    Session::with_options(m, options).unwrap()
}

fn steps<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let mut s = demo_session(client, &demo, SessionOptions::default());
    let cuda = caps::runtime_name(client) == "cuda";
    let prompt: Vec<u32> = vec![5, 80, 300, 17, 999, 42, 80, 80];
    let mut distinct = std::collections::BTreeSet::new();
    for p in params() {
        s.reset().unwrap();
        s.prefill(&prompt).unwrap();
        let mut context = prompt.clone();
        let mut rng = Rng::new(p.seed);
        for step in 0..20 {
            let u = if p.temperature == 0.0 {
                0.0
            } else {
                rng.next_f64()
            };
            let mut logits = Vec::new();
            s.logits(&mut logits).unwrap();
            let token = s.sample_on_device(&p, &context, u).unwrap().unwrap();
            check(&format!("step {step}"), &logits, &context, &p, u, token);
            distinct.insert(token);
            context.push(token);
            s.decode(token).unwrap();
        }
    }
    assert!(distinct.len() > 10, "the draws hardly vary: {distinct:?}");
    assert_eq!(s.sampling_uses_graph(), cuda, "sampling graph on CUDA only");

    // A context the session did not follow (here: one token changed) refills the mask.
    let p = params()[2];
    s.reset().unwrap();
    s.prefill(&prompt).unwrap();
    let mut context = prompt.clone();
    let first = s.sample_on_device(&p, &context, 0.3).unwrap().unwrap();
    context.push(first);
    s.decode(first).unwrap();
    context[0] = 6;
    let mut logits = Vec::new();
    s.logits(&mut logits).unwrap();
    let token = s.sample_on_device(&p, &context, 0.6).unwrap().unwrap();
    check("refilled", &logits, &context, &p, 0.6, token);

    // Off: the session declines, the caller samples on the host.
    let mut host = demo_session(
        client,
        &demo,
        SessionOptions {
            device_sampling: false,
            ..SessionOptions::default()
        },
    );
    host.prefill(&prompt).unwrap();
    assert_eq!(host.sample_on_device(&p, &prompt, 0.5).unwrap(), None);
}

#[test]
fn session_samples_on_the_device() {
    on_each_runtime_one_cuda_at_a_time!(steps);
}

/// The generator's text with the device sampler is the host sampler's for the same seed (the
/// draws are the same up to rounding, and no `u` of these seeds falls that close to a
/// boundary).
fn generator<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let mut outputs = Vec::new();
    for device_sampling in [true, false] {
        let s = demo_session(
            client,
            &demo,
            SessionOptions {
                device_sampling,
                ..SessionOptions::default()
            },
        );
        let config = s.model().config().clone();
        let tok = Tokenizer::from_dir(&demo.0, &config, s.model().generation_config()).unwrap();
        let mut g = Generator::new(s, tok);
        let mut runs = Vec::new();
        for p in params() {
            let options = GenerateOptions {
                max_new_tokens: 24,
                sampling: p,
                eos_token_ids: Some(Vec::new()),
                ..GenerateOptions::default()
            };
            let out = g
                .generate(&Prompt::Tokens(vec![3, 14, 15, 92, 65]), &options, |_| {
                    ControlFlow::Continue(())
                })
                .unwrap();
            runs.push(out.tokens);
        }
        outputs.push(runs);
    }
    assert_eq!(outputs[0], outputs[1]);
}

#[test]
fn device_and_host_sampling_give_the_same_text() {
    on_each_runtime_one_cuda_at_a_time!(generator);
}
