//! The committed transformers fixtures (tests/fixtures/hf, made by scripts/make_hf_fixtures.py)
//! parse with our config, tokenizer and weight code, and are self-consistent. The comparison of
//! our logits with theirs runs where the forward pass does (tests/device).

mod common;

use common::FIXTURES;
use model::sampling::argmax;
use model::{plan_weights, GenerationConfig, ModelConfig, Tokenizer, WeightStore};
use ops::DType;

fn f32s(store: &WeightStore, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = store.get(name).unwrap();
    (t.shape.to_vec(), t.to_f32().unwrap())
}

/// The fixtures carry the demo tokenizer as it was when they were made; if the demo tokenizer
/// changes (corpus, trainer settings), the fixtures must be regenerated with the script.
#[test]
fn fixtures_use_the_current_demo_tokenizer() {
    let files = model::demo::files().unwrap();
    let demo_tok = &files
        .iter()
        .find(|(n, _)| *n == "tokenizer.json")
        .unwrap()
        .1;
    for name in FIXTURES {
        let fixture_tok =
            std::fs::read(common::fixtures_dir().join(name).join("tokenizer.json")).unwrap();
        assert!(
            fixture_tok == *demo_tok,
            "{name}: tokenizer.json differs from the demo tokenizer; rerun scripts/make_hf_fixtures.py"
        );
    }
}

#[test]
fn every_fixture_parses_and_is_consistent() {
    let root = common::fixtures_dir();
    let mut seen = std::collections::BTreeSet::new();
    for name in FIXTURES {
        let dir = root.join(name);
        let config = ModelConfig::from_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        seen.insert((
            config.tie_word_embeddings,
            config.num_hidden_layers,
            config.kv_group() > 1,
            config.rope_theta as u64,
            config.vocab_size,
            config.model_type,
            config.rope_scaling != ops::rope::RopeScaling::None,
            config.block.o_bias,
        ));
        let generation = GenerationConfig::from_dir(&dir).unwrap();
        let tok = Tokenizer::from_dir(&dir, &config, &generation).unwrap();
        assert!(tok.vocab_size() <= config.vocab_size, "{name}");
        let store = WeightStore::open(&dir).unwrap();
        let plan = plan_weights(&config, &store).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(plan.checkpoint_dtype, DType::BF16, "{name}");
        assert!(plan.unused.is_empty(), "{name}: {:?}", plan.unused);

        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let prompt = meta["prompt"].as_str().unwrap();
        let want_ids: Vec<u32> = serde_json::from_value(meta["prompt_ids"].clone()).unwrap();
        // Our tokenizer reproduces the ids the Python tokenizers library gave the reference.
        assert_eq!(tok.encode(prompt, true).unwrap(), want_ids, "{name}");

        // reference.safetensors: shapes and self-consistency.
        let refs = WeightStore::open_file(&dir.join("reference.safetensors")).unwrap();
        let ids: Vec<u32> = refs
            .i32s("prompt_ids")
            .unwrap()
            .into_iter()
            .map(|i| i as u32)
            .collect();
        assert_eq!(ids, want_ids, "{name}");
        let (shape, logits) = f32s(&refs, "logits");
        assert_eq!(shape, vec![want_ids.len(), config.vocab_size], "{name}");
        let (gshape, greedy_logits) = f32s(&refs, "greedy_logits");
        assert_eq!(gshape, vec![32, config.vocab_size], "{name}");
        let greedy: Vec<u32> = serde_json::from_value(meta["greedy_ids"].clone()).unwrap();
        assert_eq!(greedy.len(), 32);
        let greedy_st: Vec<u32> = refs
            .i32s("greedy_ids")
            .unwrap()
            .into_iter()
            .map(|i| i as u32)
            .collect();
        assert_eq!(greedy_st, greedy, "{name}");
        let v = config.vocab_size;
        // The first greedy token is the argmax of the prompt's last logits, and each step's
        // recorded logits give that step's token.
        assert_eq!(
            argmax(&logits[(want_ids.len() - 1) * v..]),
            Some(greedy[0]),
            "{name}"
        );
        for (i, row) in greedy_logits.chunks(v).enumerate() {
            assert_eq!(argmax(row), Some(greedy[i]), "{name} step {i}");
        }
        assert!(logits.iter().all(|x| x.is_finite()));
    }
    // The fixture set covers the shapes of the target model: untied + GQA, tied + theta 1e6.
    assert!(seen.iter().any(|s| !s.0 && s.2), "untied + GQA");
    assert!(
        seen.iter().any(|s| s.0 && s.3 == 1_000_000),
        "tied + theta 1e6"
    );
    assert!(
        seen.iter().any(|s| s.1 == 1) && seen.iter().any(|s| s.1 == 4),
        "1 and 4 layers"
    );
    assert!(seen.iter().any(|s| s.4 % 2 == 1), "odd vocabulary");
    // Qwen3 tied with GQA and untied without, Llama 3 with scaled RoPE, Llama with biases.
    let family = |t: &'static str| seen.iter().filter(move |s| s.5 == t);
    assert!(family("qwen3").any(|s| s.0 && s.2), "qwen3 tied + GQA");
    assert!(family("qwen3").any(|s| !s.0 && !s.2), "qwen3 untied, MHA");
    assert!(
        family("llama").any(|s| s.6 && s.0),
        "llama3 RoPE scaling, tied"
    );
    assert!(
        family("llama").any(|s| s.7 && !s.0),
        "llama attention biases, untied"
    );
    assert!(family("qwen2").all(|s| !s.6 && !s.7));
}
