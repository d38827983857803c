//! Every fixture of every family against transformers: the logits of every prompt position
//! after prefill, the 32 greedy tokens, and every decode step's logits, in f32 and f16 (and
//! bf16 where the runtime has it).

use cubecl::prelude::*;
use model::{CausalLm, LoadOptions, Session};
use ops::{caps, DType};
use testkit::on_each_runtime_one_cuda_at_a_time;

use crate::common::FIXTURES;
use crate::{check_fixture_logits, fixture, load, reference};

fn matches_transformers<R: Runtime>(client: &ComputeClient<R>) {
    let mut dtypes = vec![DType::F32, DType::F16];
    if caps::supports_dtype(client, DType::BF16) {
        dtypes.push(DType::BF16);
    }
    for name in FIXTURES {
        let dir = fixture(name);
        let r = reference(&dir);
        for &dtype in &dtypes {
            let what = format!("{name} {dtype} on {}", caps::runtime_name(client));
            let opts = LoadOptions {
                dtype: Some(dtype),
                max_len: Some(128),
                ..LoadOptions::default()
            };
            let (m, _) = load(client, &dir, &opts).unwrap();
            assert_eq!(m.config().vocab_size, r.vocab, "{what}");
            let mut session = Session::new(m).unwrap();
            // Prefill: every prompt position's logits.
            let got = session
                .prefill_all_logits(&r.prompt)
                .unwrap()
                .to_f32_vec(client)
                .unwrap();
            let (rel, abs) = check_fixture_logits(&what, dtype, &r, &got, &r.logits);
            eprintln!("{what}: prefill logits relative error {rel:.2e}, largest {abs:.3}");
            // Greedy decoding, step by step through the decode path: ids and logits.
            session.reset().unwrap();
            session.prefill(&r.prompt).unwrap();
            let mut logits = Vec::new();
            let (mut worst_rel, mut worst_abs) = (0f64, 0f64);
            for (i, &want) in r.greedy.iter().enumerate() {
                let next = session.argmax().unwrap();
                assert_eq!(next, want, "{what}: greedy token {i}");
                session.logits(&mut logits).unwrap();
                let (rel, abs) = check_fixture_logits(
                    &format!("{what}: decode step {i}"),
                    dtype,
                    &r,
                    &logits,
                    &r.greedy_logits[i * r.vocab..(i + 1) * r.vocab],
                );
                worst_rel = worst_rel.max(rel);
                worst_abs = worst_abs.max(abs);
                session.decode(next).unwrap();
            }
            eprintln!(
                "{what}: 32 greedy tokens match, decode logits relative error {worst_rel:.2e}, \
                 largest {worst_abs:.3}"
            );
        }
    }
}

#[test]
fn logits_and_greedy_tokens_match_transformers() {
    on_each_runtime_one_cuda_at_a_time!(matches_transformers);
}
