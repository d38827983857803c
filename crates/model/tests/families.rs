//! The families beside Qwen2: Qwen3 and Llama config mappings (their fields, defaults and
//! refusals) and the tensors their checkpoints must hold, by name.

mod common;

use std::path::Path;

use common::{write_model, TempDir};
use model::models::decoder::DecoderBlock;
use model::{plan_weights, ModelConfig, ModelError, WeightStore};
use ops::rope::RopeScaling;
use safetensors::Dtype;
use serde_json::{json, Value};

fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_value(v, Path::new("/m/config.json"))
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn without(mut v: Value, key: &str) -> Value {
    v.as_object_mut().unwrap().remove(key);
    v
}

fn field_error(v: &Value) -> String {
    match parse(v) {
        Err(ModelError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    }
}

/// A small Qwen3: hidden 8, 2 layers, 2/1 heads of 8 (wider than hidden / heads).
fn qwen3() -> Value {
    json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "vocab_size": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": true, "dtype": "bfloat16", "attention_bias": false,
    })
}

/// A small Llama 3.2-style config (transformers 4 spelling: rope_theta + rope_scaling).
fn llama() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "attention_bias": false, "mlp_bias": false,
    })
}

#[test]
fn qwen3_config_follows_transformers() {
    let c = parse(&qwen3()).unwrap();
    assert_eq!(
        (c.model_type, c.architecture.as_str()),
        ("qwen3", "Qwen3ForCausalLM")
    );
    assert_eq!(c.head_dim, 8);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert_eq!(
        c.block,
        DecoderBlock {
            qkv_bias: false,
            o_bias: false,
            qk_norm: true
        }
    );
    // attention_bias: biases on q, k, v and o.
    let c = parse(&with(qwen3(), "attention_bias", json!(true))).unwrap();
    assert!(c.block.qkv_bias && c.block.o_bias && c.block.qk_norm);
    // head_dim is 128 when missing (Qwen3Config's default, not hidden / heads).
    let v = with(
        with(without(qwen3(), "head_dim"), "hidden_size", json!(1024)),
        "num_attention_heads",
        json!(16),
    );
    assert_eq!(parse(&v).unwrap().head_dim, 128);
    // num_key_value_heads is 32 when missing, num_attention_heads when null.
    let v = with(
        without(qwen3(), "num_key_value_heads"),
        "num_attention_heads",
        json!(32),
    );
    assert_eq!(parse(&v).unwrap().num_key_value_heads, 32);
    let v = with(qwen3(), "num_key_value_heads", Value::Null);
    assert_eq!(parse(&v).unwrap().num_key_value_heads, 2);
    // model_type alone, and the headless class.
    let c = parse(&without(qwen3(), "architectures")).unwrap();
    assert_eq!(c.architecture, "Qwen3ForCausalLM");
    let c = parse(&with(qwen3(), "architectures", json!(["Qwen3Model"]))).unwrap();
    assert_eq!(c.architecture, "Qwen3Model");
    assert_eq!(
        field_error(&with(qwen3(), "attention_bias", json!(1))),
        "attention_bias"
    );
}

#[test]
fn llama_config_follows_transformers() {
    let c = parse(&llama()).unwrap();
    assert_eq!((c.model_type, c.head_dim), ("llama", 4));
    assert_eq!(c.block, DecoderBlock::default());
    let want = RopeScaling::Llama3 {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64,
    };
    assert_eq!((c.rope_theta, c.rope_scaling), (5e5, want));
    // transformers 5 spelling: rope_parameters carries the theta and the scaling.
    let mut params = llama()["rope_scaling"].clone();
    params["rope_theta"] = json!(500000.0);
    let v5 = with(
        without(without(llama(), "rope_scaling"), "rope_theta"),
        "rope_parameters",
        params,
    );
    let c5 = parse(&v5).unwrap();
    assert_eq!((c5.rope_theta, c5.rope_scaling), (5e5, want));
    // The legacy "type" key, and original_max_position_embeddings defaulting to
    // max_position_embeddings.
    let legacy = json!({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0});
    let c = parse(&with(llama(), "rope_scaling", legacy)).unwrap();
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 128,
        }
    );
    // attention_bias: q, k, v and o.
    let c = parse(&with(llama(), "attention_bias", json!(true))).unwrap();
    assert!(c.block.qkv_bias && c.block.o_bias && !c.block.qk_norm);
    // Defaults of LlamaConfig: kv heads = heads, head_dim = hidden / heads, 2048 positions,
    // bos 1 and eos 2 when the fields are missing (none when null).
    let bare = without(
        without(
            without(llama(), "num_key_value_heads"),
            "max_position_embeddings",
        ),
        "rope_scaling",
    );
    let c = parse(&bare).unwrap();
    assert_eq!(
        (c.num_key_value_heads, c.max_position_embeddings),
        (2, 2048)
    );
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
    let c = parse(&with(
        with(bare, "bos_token_id", Value::Null),
        "eos_token_id",
        json!([7, 9]),
    ))
    .unwrap();
    assert_eq!((c.bos_token_id, c.eos_token_ids), (None, vec![7, 9]));
    // An explicit head_dim (Llama 3.2 3B style), but hidden must still divide by the heads.
    let c = parse(&with(llama(), "head_dim", json!(16))).unwrap();
    assert_eq!(c.head_dim, 16);
    let v = with(
        with(llama(), "head_dim", json!(4)),
        "num_attention_heads",
        json!(3),
    );
    assert_eq!(
        field_error(&with(v, "num_key_value_heads", json!(1))),
        "hidden_size"
    );
}

#[test]
fn llama_refusals_name_the_field() {
    let (mlp, msg) = match parse(&with(llama(), "mlp_bias", json!(true))) {
        Err(e @ ModelError::Config { .. }) => (
            field_error(&with(llama(), "mlp_bias", json!(true))),
            e.to_string(),
        ),
        other => panic!("{other:?}"),
    };
    assert_eq!(mlp, "mlp_bias");
    assert!(
        msg.contains("/m/config.json") && msg.contains("not supported"),
        "{msg}"
    );
    for (rope, field) in [
        (json!({"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
        (
            json!({"rope_type": "dynamic", "factor": 2.0}),
            "rope_scaling",
        ),
        (
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}),
            "rope_scaling.high_freq_factor",
        ),
        (
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                "high_freq_factor": 1.0}),
            "rope_scaling",
        ),
        (
            json!({"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0,
                "high_freq_factor": 4.0}),
            "rope_scaling.factor",
        ),
        (
            json!({"rope_type": "default", "partial_rotary_factor": 0.5}),
            "rope_scaling.partial_rotary_factor",
        ),
    ] {
        assert_eq!(
            field_error(&with(llama(), "rope_scaling", rope.clone())),
            field,
            "{rope}"
        );
    }
    let err = parse(&with(
        llama(),
        "rope_scaling",
        json!({"rope_type": "yarn", "factor": 4.0}),
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("yarn") && err.contains("llama3"), "{err}");
}

/// Every tensor of a tiny checkpoint of `config` (hidden 8, 2/1 heads of `d`, intermediate 12,
/// vocab 16, tied), with the block's optional tensors when asked.
fn tensors(d: usize, qkv_bias: bool, o_bias: bool, qk_norm: bool) -> Vec<(String, Vec<usize>)> {
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![16, 8])];
    for l in 0..2 {
        let p = format!("model.layers.{l}.");
        let mut add = |n: &str, s: Vec<usize>| t.push((format!("{p}{n}"), s));
        add("input_layernorm.weight", vec![8]);
        for (n, rows) in [("q", 2 * d), ("k", d), ("v", d)] {
            add(&format!("self_attn.{n}_proj.weight"), vec![rows, 8]);
            if qkv_bias {
                add(&format!("self_attn.{n}_proj.bias"), vec![rows]);
            }
        }
        if qk_norm {
            add("self_attn.q_norm.weight", vec![d]);
            add("self_attn.k_norm.weight", vec![d]);
        }
        add("self_attn.o_proj.weight", vec![8, 2 * d]);
        if o_bias {
            add("self_attn.o_proj.bias", vec![8]);
        }
        add("post_attention_layernorm.weight", vec![8]);
        add("mlp.gate_proj.weight", vec![12, 8]);
        add("mlp.up_proj.weight", vec![12, 8]);
        add("mlp.down_proj.weight", vec![8, 12]);
    }
    t.push(("model.norm.weight".into(), vec![8]));
    t
}

fn plan(config: &Value, tensors: &[(String, Vec<usize>)]) -> Result<model::WeightPlan, ModelError> {
    let dir = TempDir::new("family-plan");
    write_model(dir.path(), config, tensors, Dtype::BF16);
    let store = WeightStore::open(dir.path())?;
    plan_weights(&ModelConfig::from_dir(dir.path())?, &store)
}

#[test]
fn checkpoints_hold_the_family_tensors_by_name() {
    // Qwen3: q/k norms, no biases; the fused uploads name their parts.
    let p = plan(&qwen3(), &tensors(8, false, false, true)).unwrap();
    assert!(p.unused.is_empty(), "{:?}", p.unused);
    let qkv = &p.uploads[2];
    let names: Vec<&str> = qkv.parts.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["q", "k", "v"].map(|n| format!("model.layers.0.self_attn.{n}_proj.weight"))
    );
    assert_eq!(qkv.shape(), vec![32, 8]);
    assert!(p
        .specs()
        .iter()
        .any(|s| s.name == "model.layers.1.self_attn.k_norm.weight"));
    // A missing norm is named; biases the config does not ask for are unused.
    let mut missing = tensors(8, false, false, true);
    missing.retain(|(n, _)| n != "model.layers.1.self_attn.q_norm.weight");
    match plan(&qwen3(), &missing) {
        Err(ModelError::MissingTensor { name, .. }) => {
            assert_eq!(name, "model.layers.1.self_attn.q_norm.weight")
        }
        other => panic!("{other:?}"),
    }
    let p = plan(&qwen3(), &tensors(8, true, true, true)).unwrap();
    assert_eq!(p.unused.len(), 8, "{:?}", p.unused);
    // ... and are planned when it does.
    let biased = with(qwen3(), "attention_bias", json!(true));
    let p = plan(&biased, &tensors(8, true, true, true)).unwrap();
    assert!(p.unused.is_empty(), "{:?}", p.unused);
    match plan(&biased, &tensors(8, false, false, true)) {
        Err(ModelError::MissingTensor { name, .. }) => {
            assert_eq!(name, "model.layers.0.self_attn.q_proj.bias")
        }
        other => panic!("{other:?}"),
    }
    // A misshapen q_norm.
    let mut wrong = tensors(8, false, false, true);
    for (n, s) in &mut wrong {
        if n.ends_with("0.self_attn.k_norm.weight") {
            *s = vec![4];
        }
    }
    match plan(&qwen3(), &wrong) {
        Err(ModelError::TensorShape { name, expected, .. }) => {
            assert_eq!(
                (name.as_str(), expected),
                ("model.layers.0.self_attn.k_norm.weight", vec![8])
            )
        }
        other => panic!("{other:?}"),
    }
    // Llama: no biases, no norms; with attention_bias, the o_proj bias too.
    let p = plan(&llama(), &tensors(4, false, false, false)).unwrap();
    assert!(p.unused.is_empty() && p.tied, "{:?}", p.unused);
    let biased = with(llama(), "attention_bias", json!(true));
    match plan(&biased, &tensors(4, true, false, false)) {
        Err(ModelError::MissingTensor { name, .. }) => {
            assert_eq!(name, "model.layers.0.self_attn.o_proj.bias")
        }
        other => panic!("{other:?}"),
    }
    assert!(plan(&biased, &tensors(4, true, true, false)).is_ok());
}
