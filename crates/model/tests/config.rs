//! config.json / generation_config.json parsing, and its errors.

mod common;

use std::path::Path;

use common::tiny_config;
use model::{GenerationConfig, ModelConfig, ModelError};
use ops::rope::RopeScaling;
use ops::DType;
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

/// The shape of DeepSeek-R1-Distill-Qwen-1.5B's config.json (transformers 4 style).
fn r1_distill_1_5b() -> Value {
    json!({
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "hidden_act": "silu",
        "hidden_size": 1536,
        "initializer_range": 0.02,
        "intermediate_size": 8960,
        "max_position_embeddings": 131072,
        "max_window_layers": 21,
        "model_type": "qwen2",
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000,
        "sliding_window": 4096,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.44.0",
        "use_cache": true,
        "use_mrope": false,
        "use_sliding_window": false,
        "vocab_size": 151936
    })
}

#[test]
fn parses_the_target_config() {
    let c = parse(&r1_distill_1_5b()).unwrap();
    assert_eq!(c.architecture, "Qwen2ForCausalLM");
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (1536, 8960, 28)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (12, 2, 128)
    );
    assert_eq!(c.kv_group(), 6);
    assert_eq!((c.q_dim(), c.kv_dim()), (1536, 256));
    assert_eq!(c.vocab_size, 151936);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.dtype, DType::BF16);
    assert_eq!(c.bos_token_id, Some(151643));
    assert_eq!(c.eos_token_ids, vec![151643]);
    // use_sliding_window is false: the window is not in force.
    assert_eq!(c.sliding_window, None);
    c.check_context(131072, Path::new("x")).unwrap();
    // 1.78 B parameters with the untied head (the "1.5B" name counts one embedding).
    assert_eq!(c.num_parameters(), 1_777_088_000);
}

#[test]
fn parses_a_qwen25_style_config_tied_theta_1e6() {
    let v = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "rope_scaling": null,
        "eos_token_id": 151645, "bos_token_id": 151643, "sliding_window": 32768,
        "use_sliding_window": false, "max_window_layers": 21,
    });
    let c = parse(&v).unwrap();
    assert!(c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.eos_token_ids, vec![151645]);
}

#[test]
fn parses_transformers_5_style_fields() {
    // dtype instead of torch_dtype, rope_parameters instead of rope_theta, layer_types.
    let v = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "dtype": "float16",
        "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024,
        "max_position_embeddings": 256,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "layer_types": ["full_attention", "full_attention"], "sliding_window": null,
        "bos_token_id": null, "eos_token_id": [7, 9],
    });
    let c = parse(&v).unwrap();
    assert_eq!(c.dtype, DType::F16);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.bos_token_id, None);
    assert_eq!(c.eos_token_ids, vec![7, 9]);
}

#[test]
fn defaults_follow_transformers() {
    let v = without(
        without(
            without(without(tiny_config(), "num_key_value_heads"), "rope_theta"),
            "rms_norm_eps",
        ),
        "torch_dtype",
    );
    let v = without(without(v, "max_position_embeddings"), "tie_word_embeddings");
    // Qwen2Config: num_key_value_heads is 32 when the field is missing, which 2 heads refuse
    // (naming the field), and num_attention_heads when it is null.
    let (f, msg) = config_error(&v);
    assert_eq!(f, "num_key_value_heads", "{msg}");
    assert!(msg.contains("32"), "{msg}");
    let thirty_two = with(
        with(v.clone(), "num_attention_heads", json!(32)),
        "hidden_size",
        json!(64),
    );
    assert_eq!(parse(&thirty_two).unwrap().num_key_value_heads, 32);
    let v = with(v, "num_key_value_heads", Value::Null);
    let c = parse(&v).unwrap();
    assert_eq!(c.num_key_value_heads, c.num_attention_heads);
    assert_eq!(c.rope_theta, 10000.0);
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.dtype, DType::F32);
    assert_eq!(c.max_position_embeddings, 32768);
    assert!(!c.tie_word_embeddings);
    // head_dim given explicitly wins over hidden / heads.
    let c = parse(&with(tiny_config(), "head_dim", json!(6))).unwrap();
    assert_eq!(c.head_dim, 6);
    // model_type alone identifies the architecture.
    let c = parse(&without(tiny_config(), "architectures")).unwrap();
    assert_eq!(c.architecture, "Qwen2ForCausalLM");
    let c = parse(&with(tiny_config(), "architectures", json!(["Qwen2Model"]))).unwrap();
    assert_eq!(c.architecture, "Qwen2Model");
}

fn config_error(v: &Value) -> (String, String) {
    match parse(v) {
        Err(e @ ModelError::Config { .. }) => {
            let ModelError::Config { ref field, .. } = e else {
                unreachable!()
            };
            (field.clone(), e.to_string())
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn missing_required_fields_are_named() {
    for field in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ] {
        let (f, msg) = config_error(&without(tiny_config(), field));
        assert_eq!(f, field);
        assert!(
            msg.contains(field) && msg.contains("missing") && msg.contains("/m/config.json"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }
}

#[test]
fn invalid_values_are_named() {
    let cases = [
        ("hidden_size", json!("64"), "hidden_size"),
        ("hidden_size", json!(0), "hidden_size"),
        ("hidden_size", json!(-3), "hidden_size"),
        ("num_key_value_heads", json!(3), "num_key_value_heads"),
        ("head_dim", json!(5), "head_dim"),
        ("hidden_size", json!(9), "hidden_size"),
        ("rope_theta", json!(-1.0), "rope_theta"),
        ("rms_norm_eps", json!(0.0), "rms_norm_eps"),
        ("tie_word_embeddings", json!("yes"), "tie_word_embeddings"),
        ("torch_dtype", json!("int8"), "torch_dtype"),
        ("hidden_act", json!("gelu"), "hidden_act"),
        ("eos_token_id", json!("</s>"), "eos_token_id"),
        (
            "rope_scaling",
            json!({"type": "yarn", "factor": 4.0}),
            "rope_scaling",
        ),
        (
            "rope_parameters",
            json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5}),
            "rope_parameters",
        ),
        (
            "rope_parameters",
            json!({"rope_type": "llama3", "rope_theta": 5e5}),
            "rope_parameters.factor",
        ),
        ("layer_types", json!(["full_attention"]), "layer_types"),
    ];
    for (key, value, field) in cases {
        let (f, msg) = config_error(&with(tiny_config(), key, value.clone()));
        assert_eq!(f, field, "{key} = {value}: {msg}");
    }
}

#[test]
fn unknown_architectures_are_refused() {
    for (arch, model_type) in [
        ("MistralForCausalLM", "mistral"),
        ("Qwen3MoeForCausalLM", "qwen3_moe"),
        ("Qwen2MoeForCausalLM", "qwen2_moe"),
    ] {
        let v = with(
            with(tiny_config(), "architectures", json!([arch])),
            "model_type",
            json!(model_type),
        );
        match parse(&v) {
            Err(e @ ModelError::UnsupportedArchitecture { .. }) => {
                assert!(e.to_string().contains(arch), "{e}");
                // The message lists what is supported.
                for known in ["Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM"] {
                    assert!(e.to_string().contains(known), "{e}");
                }
                assert_eq!(e.kind(), "architecture");
            }
            other => panic!("{arch}: {other:?}"),
        }
    }
    // A known class name with a foreign model_type is not trusted either.
    let v = with(tiny_config(), "model_type", json!("llama"));
    assert!(matches!(
        parse(&v),
        Err(ModelError::UnsupportedArchitecture { .. })
    ));
    let v = without(without(tiny_config(), "architectures"), "model_type");
    assert_eq!(config_error(&v).0, "architectures");
}

#[test]
fn sliding_window_in_force_limits_the_context() {
    let v = with(
        with(
            with(tiny_config(), "use_sliding_window", json!(true)),
            "sliding_window",
            json!(32),
        ),
        "max_window_layers",
        json!(1),
    );
    let c = parse(&v).unwrap();
    assert_eq!(c.sliding_window, Some((32, 1)));
    c.check_context(32, Path::new("/m/config.json")).unwrap();
    let err = c
        .check_context(33, Path::new("/m/config.json"))
        .unwrap_err();
    assert!(err.to_string().contains("sliding_window"), "{err}");
    // transformers 5 style
    let v = with(
        with(
            tiny_config(),
            "layer_types",
            json!(["full_attention", "sliding_attention"]),
        ),
        "sliding_window",
        json!(16),
    );
    assert_eq!(parse(&v).unwrap().sliding_window, Some((16, 1)));
    // A window in config.json that is not in force is ignored.
    let v = with(tiny_config(), "sliding_window", json!(4));
    assert_eq!(parse(&v).unwrap().sliding_window, None);
}

#[test]
fn file_errors_name_the_file() {
    let dir = common::TempDir::new("config-files");
    let err = ModelConfig::from_dir(dir.path()).unwrap_err();
    assert_eq!(err.kind(), "io");
    assert!(err.to_string().contains("config.json"), "{err}");
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    let err = ModelConfig::from_dir(dir.path()).unwrap_err();
    assert_eq!(err.kind(), "json");
    assert!(err.to_string().contains("config.json"), "{err}");
    std::fs::write(dir.join("config.json"), "[1, 2]").unwrap();
    assert_eq!(
        ModelConfig::from_dir(dir.path()).unwrap_err().kind(),
        "json"
    );
}

#[test]
fn generation_config_is_optional_and_eos_may_be_a_list() {
    let dir = common::TempDir::new("genconfig");
    assert_eq!(
        GenerationConfig::from_dir(dir.path()).unwrap(),
        GenerationConfig::default()
    );
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05}"#,
    )
    .unwrap();
    let g = GenerationConfig::from_dir(dir.path()).unwrap();
    assert_eq!(g.bos_token_id, Some(151643));
    assert_eq!(g.eos_token_ids, vec![151645, 151643]);
    assert_eq!(g.do_sample, Some(true));
    assert_eq!(g.temperature, Some(0.6));
    assert_eq!(g.top_p, Some(0.95));
    assert_eq!(g.top_k, Some(20));
    assert_eq!(g.repetition_penalty, Some(1.05));
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 2}"#).unwrap();
    assert_eq!(
        GenerationConfig::from_dir(dir.path())
            .unwrap()
            .eos_token_ids,
        vec![2]
    );
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"temperature": "hot"}"#,
    )
    .unwrap();
    let err = GenerationConfig::from_dir(dir.path()).unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
}
