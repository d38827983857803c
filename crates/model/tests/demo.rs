//! The demo model: deterministic, loadable by our own config/tokenizer/weights code.

use model::{
    demo, plan_weights, ChatMessage, GenerationConfig, ModelConfig, Tokenizer, WeightStore,
};

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cubellm-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn demo_model_files_are_the_same_bytes_every_time() {
    let a = demo::files().unwrap();
    let b = demo::files().unwrap();
    assert_eq!(a.len(), b.len());
    for ((na, ba), (nb, bb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert!(ba == bb, "{na} differs between two builds");
    }
    // Small enough for lavapipe and for a cache directory.
    let total: usize = a.iter().map(|(_, b)| b.len()).sum();
    assert!(total < 4 << 20, "demo model is {total} bytes");
}

#[test]
fn demo_model_loads_with_the_model_code() {
    let dir = tempdir("demo-load");
    demo::write_demo_model(&dir).unwrap();
    let config = ModelConfig::from_dir(&dir).unwrap();
    assert_eq!(config.num_hidden_layers, demo::LAYERS);
    assert_eq!(config.vocab_size, demo::DEMO_VOCAB);
    assert!(config.tie_word_embeddings);
    let generation = GenerationConfig::from_dir(&dir).unwrap();
    let tok = Tokenizer::from_dir(&dir, &config, &generation).unwrap();
    assert_eq!(tok.vocab_size(), config.vocab_size);
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(tok.eos_token_ids(), &[im_end, eot]);

    let store = WeightStore::open(&dir).unwrap();
    let plan = plan_weights(&config, &store).unwrap();
    assert!(plan.tied);
    assert_eq!(plan.specs().len(), 1 + 12 * demo::LAYERS + 1);
    assert!(plan.unused.is_empty(), "{:?}", plan.unused);

    // Chat template renders the ChatML turns with the default system prompt.
    let text = tok
        .apply_chat_template(&[ChatMessage::user("Hello")], true)
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(ids[0], tok.token_to_id("<|im_start|>").unwrap());
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn concurrent_first_use_builds_one_complete_model() {
    let root = tempdir("demo-concurrent");
    let dir = root.join("cache").join(demo::DEMO_VERSION);
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let dir = dir.clone();
            std::thread::spawn(move || demo::ensure_demo_model_in(&dir))
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    let files = demo::files().unwrap();
    for (name, bytes) in &files {
        assert_eq!(&std::fs::read(dir.join(name)).unwrap(), bytes, "{name}");
    }
    // No temporary directories are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(root.join("cache"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from(demo::DEMO_VERSION)]
    );
    std::fs::remove_dir_all(&root).unwrap();
}
