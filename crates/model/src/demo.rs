//! The embedded demo model: a tiny Qwen2 (2 layers, hidden 128, 4 query / 2 KV heads, tied
//! embeddings, f32) with seeded-random weights and a byte-level BPE tokenizer trained with the
//! tokenizers crate on the text in `assets/corpus/` (public-domain texts, the project's own
//! notes, documentation and sources), compiled into the library.
//!
//! It exists so that `cubellm generate` works on any machine with no download: the text it writes
//! is gibberish (the weights are random), but every part of the pipeline runs. Building it is
//! deterministic: the same files, byte for byte, every time (the tokenizer trainer orders its
//! merges by count and then by pair, and the weights come from this crate's own generator using
//! exact arithmetic only), which a test checks.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, SplitDelimiterBehavior, TokenizerBuilder, TokenizerImpl,
};

use crate::error::{ModelError, Result};
use crate::sampling::Rng;

/// Bumped whenever the demo model's bytes change, so that stale cached copies are not reused.
pub const DEMO_VERSION: &str = "demo-v2";

/// The training text, compiled in so that the demo model can be built without the sources.
pub const CORPUS: [(&str, &str); 3] = [
    ("notes.txt", include_str!("../assets/corpus/notes.txt")),
    (
        "public_domain.txt",
        include_str!("../assets/corpus/public_domain.txt"),
    ),
    ("project.txt", include_str!("../assets/corpus/project.txt")),
];

/// Tokens in the demo vocabulary (special tokens and the 256 byte tokens included).
pub const DEMO_VOCAB: usize = 1024;
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The pre-tokenizer pattern of Qwen2's tokenizer (contractions, letters, single digits,
/// punctuation runs, newlines, spaces).
pub const QWEN2_SPLIT_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A ChatML template like Qwen2-Instruct's (default system prompt when none is given).
pub const CHAT_TEMPLATE: &str = "{%- for message in messages %}\n{%- if loop.first and message['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}\n{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\n{%- endfor %}\n{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}\n";

pub const HIDDEN: usize = 128;
pub const INTERMEDIATE: usize = 352;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const MAX_POSITIONS: usize = 512;
pub const SEED: u64 = 0x5EED_0001;

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("training the demo tokenizer: {e}"))
}

/// Trains the demo tokenizer on [`CORPUS`].
pub fn train_tokenizer() -> Result<tokenizers::Tokenizer> {
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(t.to_string(), true))
        .collect();
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(DEMO_VOCAB)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials.clone())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let split = Split::new(
        SplitPattern::Regex(QWEN2_SPLIT_PATTERN.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(tok_err)?;
    let pre = Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ]);
    let mut tokenizer: TokenizerImpl<
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    > = TokenizerBuilder::new()
        .with_model(ModelWrapper::BPE(BPE::default()))
        .with_normalizer(Some(NormalizerWrapper::NFC(NFC)))
        .with_pre_tokenizer(Some(PreTokenizerWrapper::Sequence(pre)))
        .with_post_processor(Some(PostProcessorWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        ))))
        .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::new(
            false, false, false,
        ))))
        .build()
        .map_err(tok_err)?;
    let mut trainer = tokenizers::models::TrainerWrapper::BpeTrainer(trainer.clone());
    let lines = CORPUS.iter().flat_map(|(_, text)| text.lines());
    tokenizer.train(&mut trainer, lines).map_err(tok_err)?;
    tokenizer.add_special_tokens(&specials);
    Ok(tokenizer.into())
}

/// `config.json` of the demo model for a tokenizer of `vocab` ids.
pub fn config_json(vocab: usize, eos: u32, bos: u32) -> serde_json::Value {
    json!({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "torch_dtype": "float32",
        "use_sliding_window": false,
        "bos_token_id": bos,
        "eos_token_id": eos,
    })
}

/// Seeded-random weights, HF-initialiser-like: uniform with standard deviation 0.02 for
/// matrices and biases, ones for the norms. Returned as (name, shape, f32 values), sorted by name.
pub fn weights(vocab: usize) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = Rng::new(SEED);
    // uniform(-a, a) has standard deviation a / sqrt(3).
    let a = 0.02 * 3f32.sqrt();
    let mut random = |shape: &[usize]| -> Vec<f32> {
        let n: usize = shape.iter().product();
        (0..n).map(|_| rng.next_signed_f32() * a).collect()
    };
    let (h, i) = (HIDDEN, INTERMEDIATE);
    let d = HIDDEN / HEADS;
    let (q, kv) = (HEADS * d, KV_HEADS * d);
    let mut out: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut push =
        |name: String, shape: Vec<usize>, values: Vec<f32>| out.push((name, shape, values));
    push(
        "model.embed_tokens.weight".into(),
        vec![vocab, h],
        random(&[vocab, h]),
    );
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}.");
        push(format!("{p}input_layernorm.weight"), vec![h], vec![1.0; h]);
        push(
            format!("{p}self_attn.q_proj.weight"),
            vec![q, h],
            random(&[q, h]),
        );
        push(format!("{p}self_attn.q_proj.bias"), vec![q], random(&[q]));
        push(
            format!("{p}self_attn.k_proj.weight"),
            vec![kv, h],
            random(&[kv, h]),
        );
        push(format!("{p}self_attn.k_proj.bias"), vec![kv], random(&[kv]));
        push(
            format!("{p}self_attn.v_proj.weight"),
            vec![kv, h],
            random(&[kv, h]),
        );
        push(format!("{p}self_attn.v_proj.bias"), vec![kv], random(&[kv]));
        push(
            format!("{p}self_attn.o_proj.weight"),
            vec![h, q],
            random(&[h, q]),
        );
        push(
            format!("{p}post_attention_layernorm.weight"),
            vec![h],
            vec![1.0; h],
        );
        push(
            format!("{p}mlp.gate_proj.weight"),
            vec![i, h],
            random(&[i, h]),
        );
        push(
            format!("{p}mlp.up_proj.weight"),
            vec![i, h],
            random(&[i, h]),
        );
        push(
            format!("{p}mlp.down_proj.weight"),
            vec![h, i],
            random(&[h, i]),
        );
    }
    push("model.norm.weight".into(), vec![h], vec![1.0; h]);
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Serialises named f32 tensors as a safetensors file (with `format: pt` metadata, which
/// transformers expects).
pub fn safetensors_bytes(tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<Vec<u8>> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| {
            (
                n.clone(),
                s.clone(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(n, s, b)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ModelError::Safetensors {
            path: PathBuf::from(crate::weights::SINGLE_FILE),
            detail: e.to_string(),
        })?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(metadata)).map_err(|e| ModelError::Safetensors {
        path: PathBuf::from(crate::weights::SINGLE_FILE),
        detail: e.to_string(),
    })
}

/// The files of the demo model, by name, as bytes.
pub fn files() -> Result<Vec<(&'static str, Vec<u8>)>> {
    let tokenizer = train_tokenizer()?;
    let vocab = tokenizer.get_vocab_size(true);
    let id = |t: &str| {
        tokenizer
            .token_to_id(t)
            .ok_or_else(|| ModelError::Tokenizer(format!("demo tokenizer lacks {t}")))
    };
    let (eot, im_end) = (id("<|endoftext|>")?, id("<|im_end|>")?);
    let pretty = |v: &serde_json::Value| {
        let mut s = serde_json::to_string_pretty(v).expect("JSON values serialise");
        s.push('\n');
        s.into_bytes()
    };
    let tokenizer_json = tokenizer.to_string(true).map_err(tok_err)?.into_bytes();
    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": false,
        "chat_template": CHAT_TEMPLATE,
    });
    let generation_config = json!({
        "bos_token_id": eot,
        "eos_token_id": [im_end, eot],
        "do_sample": true,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
    });
    Ok(vec![
        ("config.json", pretty(&config_json(vocab, im_end, eot))),
        ("generation_config.json", pretty(&generation_config)),
        ("tokenizer.json", tokenizer_json),
        ("tokenizer_config.json", pretty(&tokenizer_config)),
        ("model.safetensors", safetensors_bytes(&weights(vocab))?),
    ])
}

/// Writes the demo model into `dir` (created if needed; existing files are overwritten).
pub fn write_demo_model(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    for (name, bytes) in files()? {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| ModelError::io(&path, e))?;
    }
    Ok(())
}

/// The cache directory of the demo model: `$XDG_CACHE_HOME/cubellm/<version>`, else
/// `~/.cache/cubellm/<version>`.
pub fn demo_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::home_dir()
                .filter(|h| !h.as_os_str().is_empty())
                .map(|h| h.join(".cache"))
        })?;
    Some(base.join("cubellm").join(DEMO_VERSION))
}

/// The demo model's directory, built on first use (into a temporary directory renamed into
/// place, so that an interrupted build or a concurrent one never leaves a partial model).
pub fn ensure_demo_model() -> Result<PathBuf> {
    let dir = demo_cache_dir().ok_or_else(|| ModelError::ModelNotFound {
        spec: "demo".into(),
        detail:
            "no cache directory (set XDG_CACHE_HOME or HOME), use `cubellm make-demo-model --out DIR`"
                .into(),
    })?;
    ensure_demo_model_in(&dir)?;
    Ok(dir)
}

/// Like [`ensure_demo_model`], into a given directory.
pub fn ensure_demo_model_in(dir: &Path) -> Result<()> {
    let complete = |d: &Path| {
        [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "model.safetensors",
        ]
        .iter()
        .all(|f| d.join(f).is_file())
    };
    if complete(dir) {
        return Ok(());
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| ModelError::io(parent, e))?;
    // Unique per process and per call, so that concurrent builds (threads or processes) never
    // write into the same temporary directory.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let tmp = parent.join(format!(
        ".{}.tmp-{}-{}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("demo"),
        std::process::id(),
        BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    write_demo_model(&tmp)?;
    if dir.exists() && !complete(dir) {
        // A partial directory from an older, interrupted layout: replace it.
        std::fs::remove_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    }
    match std::fs::rename(&tmp, dir) {
        Ok(()) => Ok(()),
        // Someone else finished first: theirs is identical.
        Err(_) if complete(dir) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(())
        }
        Err(e) => Err(ModelError::io(dir, e)),
    }
}
