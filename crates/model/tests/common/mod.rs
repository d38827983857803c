//! Helpers shared by the model crate's tests: temporary model directories and tiny checkpoints.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// A fresh temporary directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "cubellm-model-test-{name}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small Qwen2 config: hidden 8, 2 layers, 2/1 heads (head_dim 4), intermediate 12, vocab 16.
pub fn tiny_config() -> Value {
    json!({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 8,
        "intermediate_size": 12,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
        "vocab_size": 16,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
    })
}

/// Every tensor of `tiny_config` (untied), name -> shape.
pub fn tiny_tensors() -> Vec<(String, Vec<usize>)> {
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![16, 8])];
    for l in 0..2 {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("input_layernorm.weight", vec![8]),
            ("self_attn.q_proj.weight", vec![8, 8]),
            ("self_attn.q_proj.bias", vec![8]),
            ("self_attn.k_proj.weight", vec![4, 8]),
            ("self_attn.k_proj.bias", vec![4]),
            ("self_attn.v_proj.weight", vec![4, 8]),
            ("self_attn.v_proj.bias", vec![4]),
            ("self_attn.o_proj.weight", vec![8, 8]),
            ("post_attention_layernorm.weight", vec![8]),
            ("mlp.gate_proj.weight", vec![12, 8]),
            ("mlp.up_proj.weight", vec![12, 8]),
            ("mlp.down_proj.weight", vec![8, 12]),
        ] {
            t.push((format!("{p}{n}"), s));
        }
    }
    t.push(("model.norm.weight".into(), vec![8]));
    t.push(("lm_head.weight".into(), vec![16, 8]));
    t
}

/// Serialises tensors of a safetensors dtype with deterministic contents (value i*0.01).
pub fn safetensors_of(tensors: &[(String, Vec<usize>)], dtype: safetensors::Dtype) -> Vec<u8> {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s)| {
            let numel: usize = s.iter().product();
            let values = (0..numel).map(|i| (i as f32) * 0.01 - 0.3);
            let bytes: Vec<u8> = match dtype {
                safetensors::Dtype::F32 => values.flat_map(f32::to_le_bytes).collect(),
                safetensors::Dtype::F16 => values
                    .flat_map(|v| half::f16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
                safetensors::Dtype::BF16 => values
                    .flat_map(|v| half::bf16::from_f32(v).to_bits().to_le_bytes())
                    .collect(),
                safetensors::Dtype::I32 => (0..numel as i32).flat_map(i32::to_le_bytes).collect(),
                other => panic!("test helper has no {other:?}"),
            };
            (n.clone(), s.clone(), bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// A model directory with `config` and a single `model.safetensors` of `tensors`.
pub fn write_model(
    dir: &Path,
    config: &Value,
    tensors: &[(String, Vec<usize>)],
    dtype: safetensors::Dtype,
) {
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors_of(tensors, dtype),
    )
    .unwrap();
}

/// The demo model written into a fresh temporary directory.
pub fn demo_model() -> TempDir {
    let dir = TempDir::new("demo");
    model::demo::write_demo_model(dir.path()).unwrap();
    dir
}

/// The committed transformers fixtures (tests/fixtures/hf, made by scripts/make_hf_fixtures.py).
pub const FIXTURES: [&str; 9] = [
    "qwen2-gqa-untied",
    "qwen25-tied-theta1e6",
    "qwen2-1layer",
    "qwen2-4layer",
    "qwen2-odd-vocab",
    "qwen3-gqa-tied",
    "qwen3-mha-untied",
    "llama3-rope-scaled",
    "llama-bias-untied",
];

/// The fixtures made by scripts/make_hf_fixtures.py.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf")
}
