//! `config.json` and `generation_config.json`: `ModelConfig::{from_value, from_dir}` and
//! `GenerationConfig::{from_value, from_dir}`, then what a load derives from an Ok result
//! (parameter count, head widths, context check, the weight plan, sampling parameters).

use std::path::Path;
use std::sync::Arc;

use model::{plan_weights, GenerationConfig, ModelConfig, Sampler, SamplingParams, WeightStore};
use serde_json::{json, Value};

use crate::common::{fixtures_dir, FIXTURES};

use super::harness::{self, mutate_bytes, mutate_json, random_json, Case, Fuzz, TempDir};

/// The fields the parser reads, and a few it does not.
const KEYS: [&str; 30] = [
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "vocab_size",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rms_norm_eps",
    "tie_word_embeddings",
    "torch_dtype",
    "dtype",
    "bos_token_id",
    "eos_token_id",
    "hidden_act",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "attention_bias",
    "mlp_bias",
    "partial_rotary_factor",
    "pad_token_id",
    "use_cache",
    "__metadata__",
];

/// A value that sits on an edge of what a size field can be.
fn edge_size(fz: &mut Fuzz) -> Value {
    match fz.below(8) {
        0 => json!(0),
        1 => json!(fz.below(9)),
        2 => json!(fz.interesting_u64()),
        3 => json!(1u64 << (32 + fz.below(31))),
        4 => json!(-(fz.below(9) as i64) - 1),
        5 => json!(fz.below(9) as f64 + 0.5),
        6 => json!(u64::MAX),
        _ => random_json(fz, 1),
    }
}

/// Garbage for the rotary parameters, often close to a valid llama3 block.
fn rope_garbage(fz: &mut Fuzz) -> Value {
    let mut obj = json!({
        "rope_type": fz.pick(&["llama3", "default", "yarn", "linear", "dynamic", ""]).to_string(),
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 500000.0,
    });
    for _ in 0..1 + fz.below(3) {
        let key = *fz.pick(&[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
            "rope_theta",
            "partial_rotary_factor",
            "type",
            "rope_type",
        ]);
        let v = match fz.below(3) {
            0 => json!(*fz.pick(&[0.0, -1.0, 1e308, 1e-320, 1.0, 4.0, 1e19, 0.5])),
            1 => edge_size(fz),
            _ => random_json(fz, 1),
        };
        obj[key] = v;
    }
    obj
}

/// A fixture's config.json with one to four structural mutations.
fn mutated_config(fz: &mut Fuzz, base: &Value) -> Value {
    let mut v = base.clone();
    for _ in 0..1 + fz.below(4) {
        let Some(map) = v.as_object_mut() else {
            break;
        };
        match fz.below(10) {
            0..=3 => {
                let key = *fz.pick(&[
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "vocab_size",
                    "max_position_embeddings",
                    "sliding_window",
                    "max_window_layers",
                    "bos_token_id",
                    "eos_token_id",
                ]);
                map.insert(key.into(), edge_size(fz));
            }
            4 => {
                let key = *fz.pick(&["rope_scaling", "rope_parameters"]);
                map.insert(key.into(), rope_garbage(fz));
            }
            5 => {
                map.remove(*fz.pick(&KEYS));
            }
            6 => {
                // Sliding window switched on with layer types that may not fit.
                map.insert("use_sliding_window".into(), json!(true));
                let n = fz.below(6);
                let types: Vec<&str> = (0..n)
                    .map(|_| *fz.pick(&["full_attention", "sliding_attention", "x"]))
                    .collect();
                map.insert("layer_types".into(), json!(types));
            }
            7 => {
                let key = fz
                    .pick(&["torch_dtype", "dtype", "hidden_act", "model_type"])
                    .to_string();
                map.insert(key, random_json(fz, 1));
            }
            _ => mutate_json(fz, &mut v, &KEYS),
        }
    }
    v
}

/// What an Ok config must satisfy, and the derived values a load computes from it.
fn check_config(c: &ModelConfig, store: &WeightStore) -> Result<(), String> {
    let sane = c.hidden_size > 0
        && c.intermediate_size > 0
        && c.num_hidden_layers > 0
        && c.vocab_size > 0
        && c.num_key_value_heads > 0
        && c.num_attention_heads.is_multiple_of(c.num_key_value_heads)
        && c.head_dim > 0
        && c.head_dim.is_multiple_of(2)
        && c.max_position_embeddings > 0
        && c.rms_norm_eps.is_finite()
        && c.rms_norm_eps > 0.0
        && c.rope_theta.is_finite()
        && c.rope_theta > 0.0
        && c.rope_scaling.validate().is_ok();
    if !sane {
        return Err(format!("accepted an unusable config: {c:?}"));
    }
    // Each of these panics on overflow in a debug build.
    let _ = (
        c.num_parameters(),
        c.q_dim(),
        c.kv_dim(),
        c.kv_group(),
        c.family(),
    );
    if c.clone() != *c {
        return Err("clone differs".into());
    }
    for max_len in [1, 4096, usize::MAX] {
        let _ = c.check_context(max_len, Path::new("config.json"));
    }
    // What a load does next: every tensor the config implies, checked against a real checkpoint.
    let _ = plan_weights(c, store);
    Ok(())
}

#[test]
fn mutated_configs_parse_or_fail_typed_and_ok_configs_are_usable() {
    let bases: Vec<(Value, Arc<WeightStore>)> = FIXTURES
        .iter()
        .map(|name| {
            let dir = fixtures_dir().join(name);
            let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
            (
                serde_json::from_str(&text).unwrap(),
                Arc::new(WeightStore::open(&dir).unwrap()),
            )
        })
        .collect();
    let scratch = Arc::new(TempDir::new("config"));
    harness::run("config", 4, 1500, |fz, seed| {
        let (base, store) = &bases[fz.below(bases.len())];
        let store = store.clone();
        let value = mutated_config(fz, base);
        // A fifth of the cases go through the file, some with bytes that are not JSON.
        let file = fz.chance(20).then(|| {
            let mut bytes = serde_json::to_vec_pretty(&value).unwrap();
            if fz.chance(30) {
                mutate_bytes(fz, &mut bytes);
            }
            bytes
        });
        let input = match &file {
            Some(b) => harness::show_bytes(b),
            None => value.to_string(),
        };
        let scratch = scratch.clone();
        Case::new(input, move || {
            let path = Path::new("fuzz/config.json");
            let result = match file {
                Some(bytes) => {
                    let dir = scratch.path().join(seed.to_string());
                    std::fs::create_dir_all(&dir).unwrap();
                    std::fs::write(dir.join("config.json"), bytes).unwrap();
                    let r = ModelConfig::from_dir(&dir);
                    let _ = std::fs::remove_dir_all(&dir);
                    r
                }
                None => ModelConfig::from_value(&value, path),
            };
            match result {
                Ok(c) => check_config(&c, &store),
                Err(e) => {
                    let msg = e.to_string();
                    if msg.contains('\n') || !msg.contains("config.json") {
                        return Err(format!("error is not one line naming the file: {msg:?}"));
                    }
                    // "io": a config.json that is not UTF-8 fails to be read as text.
                    if !matches!(e.kind(), "config" | "json" | "architecture" | "io") {
                        return Err(format!("unexpected error kind {}: {msg}", e.kind()));
                    }
                    Ok(())
                }
            }
        })
    });
}

/// The sampling parameters the CLI builds from a generation config (see `cli::generate`).
fn sampling_from(gc: &GenerationConfig, seed: u64) -> SamplingParams {
    let sample = gc.do_sample == Some(true);
    SamplingParams {
        temperature: if sample {
            gc.temperature.map(|t| t as f32).unwrap_or(1.0)
        } else {
            0.0
        },
        top_k: if sample { gc.top_k.unwrap_or(0) } else { 0 },
        top_p: if sample {
            gc.top_p.map(|p| p as f32).unwrap_or(1.0)
        } else {
            1.0
        },
        repetition_penalty: gc.repetition_penalty.map(|p| p as f32).unwrap_or(1.0),
        seed,
    }
}

#[test]
fn mutated_generation_configs_parse_or_fail_typed_and_sample_or_fail_typed() {
    let base = json!({
        "bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": true, "temperature": 0.7,
        "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05, "max_new_tokens": 64,
    });
    let keys = [
        "bos_token_id",
        "eos_token_id",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "repetition_penalty",
    ];
    let scratch = Arc::new(TempDir::new("generation"));
    harness::run("generation-config", 5, 1500, |fz, seed| {
        let mut value = base.clone();
        for _ in 0..1 + fz.below(3) {
            match (fz.below(3), value.as_object_mut()) {
                (0, Some(map)) => {
                    map.insert(fz.pick(&keys).to_string(), edge_size(fz));
                }
                (1, Some(map)) => {
                    let v = json!(*fz.pick(&[0.0, -1.0, 1e308, 1e-320, 2.0, 1e39, -1e39]));
                    map.insert(fz.pick(&keys).to_string(), v);
                }
                _ => mutate_json(fz, &mut value, &keys),
            }
        }
        let as_file = fz.chance(20);
        let input = value.to_string();
        let scratch = scratch.clone();
        Case::new(input, move || {
            let result = if as_file {
                let dir = scratch.path().join(seed.to_string());
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join("generation_config.json"), value.to_string()).unwrap();
                let r = GenerationConfig::from_dir(&dir);
                let _ = std::fs::remove_dir_all(&dir);
                r
            } else {
                GenerationConfig::from_value(&value, Path::new("generation_config.json"))
            };
            let gc = match result {
                Err(e)
                    if matches!(e.kind(), "config" | "json") && !e.to_string().contains('\n') =>
                {
                    return Ok(())
                }
                Err(e) => return Err(format!("unexpected error {}: {e}", e.kind())),
                Ok(gc) => gc,
            };
            let params = sampling_from(&gc, seed);
            let Ok(mut sampler) = Sampler::new(params) else {
                return Ok(());
            };
            let mut logits = vec![0.1, 2.0, -1.0, 0.5, f32::NEG_INFINITY];
            match sampler.sample(&mut logits, &[0, 7, u32::MAX]) {
                Ok(id) if (id as usize) < 5 => Ok(()),
                Ok(id) => Err(format!("sampled id {id} of 5 logits")),
                Err(e) if e.kind() == "logits" => Ok(()),
                Err(e) => Err(format!("sampling failed: {e}")),
            }
        })
    });
}

/// Fixed inputs: sizes whose products overflow must be refused by the parser, since every
/// derived width (`q_dim`, `kv_dim`, `num_parameters`) would otherwise overflow.
#[test]
fn configs_whose_sizes_overflow_are_errors() {
    let base: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures_dir().join("qwen2-4layer").join("config.json")).unwrap(),
    )
    .unwrap();
    let huge = json!(1u64 << 62);
    let cases = [
        ("hidden_size", json!(u64::MAX - 1)),
        ("vocab_size", huge.clone()),
        ("intermediate_size", huge.clone()),
        ("num_hidden_layers", huge.clone()),
        ("head_dim", huge.clone()),
        ("num_attention_heads", json!(1u64 << 40)),
    ];
    for (i, (field, v)) in cases.into_iter().enumerate() {
        let mut value = base.clone();
        value[field] = v.clone();
        if field == "num_attention_heads" {
            value["num_key_value_heads"] = v.clone();
            value["head_dim"] = json!(1u64 << 40);
        }
        let input = value.to_string();
        harness::run_case(
            "config-fixed",
            i as u64,
            Case::new(input, move || {
                match ModelConfig::from_value(&value, Path::new("config.json")) {
                    Err(e) if e.kind() == "config" => Ok(()),
                    Err(e) => Err(format!("{field}: unexpected error {e}")),
                    Ok(c) => Err(format!(
                        "{field} = {v}: accepted, num_parameters would overflow: {c:?}"
                    )),
                }
            }),
        );
    }
}

/// A layer count far beyond the checkpoint is refused by the weight plan without planning
/// every layer first (it used to build 2^40 layers' tensor lists before checking any).
#[test]
fn a_huge_layer_count_fails_the_weight_plan_quickly() {
    let dir = fixtures_dir().join("qwen2-1layer");
    let mut value: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    value["num_hidden_layers"] = json!(1u64 << 40);
    value.as_object_mut().unwrap().remove("layer_types");
    let input = value.to_string();
    harness::run_case(
        "plan-huge-layers",
        0,
        Case::new(input, move || {
            let store = WeightStore::open(&dir).unwrap();
            match ModelConfig::from_value(&value, Path::new("config.json")) {
                Err(_) => Ok(()),
                Ok(c) => match plan_weights(&c, &store) {
                    Err(e) if e.kind() == "missing-tensor" => Ok(()),
                    r => Err(format!("plan: {:?}", r.map(|p| p.uploads.len()))),
                },
            }
        }),
    );
}
