//! Safetensors loading and weight planning: every way a checkpoint can be wrong is an error
//! that names the file or the tensor, never a panic.

mod common;

use common::{safetensors_of, tiny_config, tiny_tensors, write_model, TempDir};
use model::weights::convert;
use model::{plan_weights, ModelConfig, ModelError, WeightStore};
use ops::DType;
use safetensors::Dtype;
use serde_json::json;

fn plan_dir(dir: &TempDir) -> Result<model::WeightPlan, ModelError> {
    let config = ModelConfig::from_dir(dir.path())?;
    let store = WeightStore::open(dir.path())?;
    plan_weights(&config, &store)
}

#[test]
fn a_complete_checkpoint_plans_every_tensor() {
    let dir = TempDir::new("complete");
    write_model(dir.path(), &tiny_config(), &tiny_tensors(), Dtype::BF16);
    let plan = plan_dir(&dir).unwrap();
    assert_eq!(plan.prefix, "model.");
    assert!(!plan.tied);
    assert_eq!(plan.checkpoint_dtype, DType::BF16);
    assert_eq!(plan.specs().len(), tiny_tensors().len());
    let names: Vec<&str> = plan.specs().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.first(), Some(&"model.embed_tokens.weight"));
    assert_eq!(names.last(), Some(&"lm_head.weight"));
    let expected_bytes: usize = tiny_tensors()
        .iter()
        .map(|(_, s)| s.iter().product::<usize>() * 2)
        .sum();
    assert_eq!(plan.bytes, expected_bytes as u64);
    assert!(plan.unused.is_empty());
}

#[test]
fn missing_directory_and_missing_weights() {
    let err = WeightStore::open(std::path::Path::new("/definitely/not/here")).unwrap_err();
    assert_eq!(err.kind(), "io");
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
    let dir = TempDir::new("noweights");
    std::fs::write(dir.join("config.json"), tiny_config().to_string()).unwrap();
    let err = WeightStore::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn truncated_empty_and_corrupt_files_are_clear_errors() {
    let dir = TempDir::new("truncated");
    let bytes = safetensors_of(&tiny_tensors(), Dtype::F32);
    let path = dir.join("model.safetensors");
    // Cut in the data section, in the header, and to nothing.
    for keep in [bytes.len() - 1, bytes.len() / 2, 20, 5, 0] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let err = WeightStore::open(dir.path()).unwrap_err();
        assert_eq!(err.kind(), "safetensors", "{keep} bytes: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains("model.safetensors") && !msg.contains('\n'),
            "{msg}"
        );
    }
    // A file that is too long is as wrong as one too short.
    let mut long = bytes.clone();
    long.extend_from_slice(&[0; 8]);
    std::fs::write(&path, &long).unwrap();
    assert_eq!(
        WeightStore::open(dir.path()).unwrap_err().kind(),
        "safetensors"
    );
    // Garbage in the header.
    let mut bad = bytes.clone();
    bad[9] = b'#';
    std::fs::write(&path, &bad).unwrap();
    assert_eq!(
        WeightStore::open(dir.path()).unwrap_err().kind(),
        "safetensors"
    );
    // A header length pointing past the end.
    let mut huge = bytes.clone();
    huge[..8].copy_from_slice(&(bytes.len() as u64 * 2).to_le_bytes());
    std::fs::write(&path, &huge).unwrap();
    assert_eq!(
        WeightStore::open(dir.path()).unwrap_err().kind(),
        "safetensors"
    );
}

#[test]
fn missing_tensors_are_named() {
    for missing in [
        "model.layers.1.mlp.up_proj.weight",
        "model.layers.0.self_attn.k_proj.bias",
        "lm_head.weight",
        "model.norm.weight",
    ] {
        let dir = TempDir::new("missing");
        let tensors: Vec<_> = tiny_tensors()
            .into_iter()
            .filter(|(n, _)| n != missing)
            .collect();
        write_model(dir.path(), &tiny_config(), &tensors, Dtype::F32);
        match plan_dir(&dir) {
            Err(ModelError::MissingTensor { name, path }) => {
                assert_eq!(name, missing);
                assert!(path.ends_with("model.safetensors"));
            }
            other => panic!("{missing}: {other:?}"),
        }
    }
}

#[test]
fn misnamed_tensors_are_missing_by_their_expected_name_and_listed_as_unused() {
    let dir = TempDir::new("misnamed");
    let tensors: Vec<_> = tiny_tensors()
        .into_iter()
        .map(|(n, s)| {
            (
                n.replace(
                    "layers.0.self_attn.q_proj.weight",
                    "layers.0.self_attn.query.weight",
                ),
                s,
            )
        })
        .collect();
    write_model(dir.path(), &tiny_config(), &tensors, Dtype::F32);
    let err = plan_dir(&dir).unwrap_err();
    assert!(
        err.to_string()
            .contains("model.layers.0.self_attn.q_proj.weight"),
        "{err}"
    );

    // An extra tensor is not an error, but is reported.
    let dir = TempDir::new("extra");
    let mut tensors = tiny_tensors();
    tensors.push((
        "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
        vec![2],
    ));
    tensors.push(("model.extra.weight".into(), vec![3]));
    write_model(dir.path(), &tiny_config(), &tensors, Dtype::F32);
    assert_eq!(
        plan_dir(&dir).unwrap().unused,
        vec!["model.extra.weight".to_string()]
    );
}

#[test]
fn wrong_shapes_are_named_with_both_shapes() {
    let dir = TempDir::new("shape");
    let tensors: Vec<_> = tiny_tensors()
        .into_iter()
        .map(|(n, s)| {
            if n == "model.layers.1.self_attn.v_proj.weight" {
                (n, vec![8, 8])
            } else {
                (n, s)
            }
        })
        .collect();
    write_model(dir.path(), &tiny_config(), &tensors, Dtype::F32);
    match plan_dir(&dir) {
        Err(e @ ModelError::TensorShape { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("model.layers.1.self_attn.v_proj.weight")
                    && msg.contains("[8, 8]")
                    && msg.contains("[4, 8]"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A config that disagrees with the checkpoint is caught the same way.
    let dir = TempDir::new("shape-config");
    let mut config = tiny_config();
    config["vocab_size"] = json!(17);
    write_model(dir.path(), &config, &tiny_tensors(), Dtype::F32);
    let err = plan_dir(&dir).unwrap_err();
    assert!(
        err.to_string().contains("model.embed_tokens.weight")
            && err.to_string().contains("[17, 8]"),
        "{err}"
    );
}

#[test]
fn unsupported_tensor_dtypes_are_named() {
    let dir = TempDir::new("dtype");
    write_model(dir.path(), &tiny_config(), &tiny_tensors(), Dtype::I32);
    match plan_dir(&dir) {
        Err(e @ ModelError::TensorDType { .. }) => {
            assert!(
                e.to_string().contains("model.embed_tokens.weight")
                    && e.to_string().contains("I32"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_architecture_in_a_model_dir() {
    let dir = TempDir::new("arch");
    let mut config = tiny_config();
    config["architectures"] = json!(["MistralForCausalLM"]);
    config["model_type"] = json!("mistral");
    write_model(dir.path(), &config, &tiny_tensors(), Dtype::F32);
    let err = plan_dir(&dir).unwrap_err();
    assert_eq!(err.kind(), "architecture");
    assert!(err.to_string().contains("MistralForCausalLM"), "{err}");
}

#[test]
fn tied_and_headless_checkpoints() {
    // Tied: lm_head is not needed, and ignored (not "unused") when present.
    let mut config = tiny_config();
    config["tie_word_embeddings"] = json!(true);
    for with_head in [false, true] {
        let dir = TempDir::new("tied");
        let tensors: Vec<_> = tiny_tensors()
            .into_iter()
            .filter(|(n, _)| with_head || n != "lm_head.weight")
            .collect();
        write_model(dir.path(), &config, &tensors, Dtype::F32);
        let plan = plan_dir(&dir).unwrap();
        assert!(plan.tied);
        assert!(!plan.specs().iter().any(|s| s.name == "lm_head.weight"));
        assert!(plan.unused.is_empty());
    }
    // Headless Qwen2Model checkpoint: names without the "model." prefix.
    let dir = TempDir::new("headless");
    config["architectures"] = json!(["Qwen2Model"]);
    let tensors: Vec<_> = tiny_tensors()
        .into_iter()
        .filter(|(n, _)| n != "lm_head.weight")
        .map(|(n, s)| (n.trim_start_matches("model.").to_string(), s))
        .collect();
    write_model(dir.path(), &config, &tensors, Dtype::F32);
    let plan = plan_dir(&dir).unwrap();
    assert_eq!(plan.prefix, "");
    assert_eq!(plan.specs()[0].name, "embed_tokens.weight");
    // ... which cannot produce logits when untied.
    config["tie_word_embeddings"] = json!(false);
    write_model(dir.path(), &config, &tensors, Dtype::F32);
    let err = plan_dir(&dir).unwrap_err();
    assert!(err.to_string().contains("tie_word_embeddings"), "{err}");
}

#[test]
fn sharded_checkpoints_load_through_the_index() {
    let dir = TempDir::new("sharded");
    std::fs::write(dir.join("config.json"), tiny_config().to_string()).unwrap();
    let all = tiny_tensors();
    let (a, b) = all.split_at(all.len() / 2);
    std::fs::write(
        dir.join("model-00001-of-00002.safetensors"),
        safetensors_of(a, Dtype::BF16),
    )
    .unwrap();
    std::fs::write(
        dir.join("model-00002-of-00002.safetensors"),
        safetensors_of(b, Dtype::BF16),
    )
    .unwrap();
    let mut map = serde_json::Map::new();
    for (n, _) in a {
        map.insert(n.clone(), json!("model-00001-of-00002.safetensors"));
    }
    for (n, _) in b {
        map.insert(n.clone(), json!("model-00002-of-00002.safetensors"));
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let plan = plan_dir(&dir).unwrap();
    assert_eq!(plan.specs().len(), all.len());
    let store = WeightStore::open(dir.path()).unwrap();
    let t = store.get("lm_head.weight").unwrap();
    assert!(t.file.ends_with("model-00002-of-00002.safetensors"));
    assert_eq!(t.shape, &[16, 8]);

    // The index naming a tensor its shard lacks, or a shard that is missing.
    map.insert(
        "model.ghost.weight".into(),
        json!("model-00001-of-00002.safetensors"),
    );
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"weight_map": map}).to_string(),
    )
    .unwrap();
    match WeightStore::open(dir.path()) {
        Err(ModelError::MissingTensor { name, path }) => {
            assert_eq!(name, "model.ghost.weight");
            assert!(path.ends_with("model-00001-of-00002.safetensors"));
        }
        other => panic!("{other:?}"),
    }
    map.remove("model.ghost.weight");
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"weight_map": map}).to_string(),
    )
    .unwrap();
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let err = WeightStore::open(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
    // A shard path that escapes the directory is refused.
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"weight_map": {"x": "../x.safetensors"}}).to_string(),
    )
    .unwrap();
    assert_eq!(WeightStore::open(dir.path()).unwrap_err().kind(), "config");
}

#[test]
fn dtype_conversion_on_the_host() {
    let values = [0.0f32, 1.0, -2.5, 3.140625, 60000.0, -1e-8, 1.0e-3];
    let bf: Vec<u8> = values
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
        .collect();
    // bf16 -> f32 is exact.
    let f = convert("t", &bf, DType::BF16, DType::F32).unwrap();
    let back: Vec<f32> = f
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for (v, b) in values.iter().zip(&back) {
        assert_eq!(half::bf16::from_f32(*v).to_f32(), *b);
    }
    // bf16 -> f16 rounds to nearest through f32.
    let h = convert("t", &bf, DType::BF16, DType::F16).unwrap();
    for (i, c) in h.chunks_exact(2).enumerate() {
        let got = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
        assert_eq!(got, half::f16::from_f32(back[i]), "element {i}");
    }
    // Same dtype: borrowed, not copied.
    assert!(matches!(
        convert("t", &bf, DType::BF16, DType::BF16).unwrap(),
        std::borrow::Cow::Borrowed(_)
    ));
    // A finite value beyond f16's range is an error naming the tensor, not a silent inf.
    let big = half::bf16::from_f32(1.0e6).to_bits().to_le_bytes();
    let err = convert(
        "model.layers.3.mlp.down_proj.weight",
        &big,
        DType::BF16,
        DType::F16,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("model.layers.3.mlp.down_proj.weight")
            && err.to_string().contains("f32"),
        "{err}"
    );
    // Infinity stays infinity (it was one already).
    let inf = half::bf16::INFINITY.to_bits().to_le_bytes();
    assert!(convert("t", &inf, DType::BF16, DType::F16).is_ok());
}

/// A checkpoint cut (or rewritten shorter) after it was opened, as another process replacing it
/// in place would: reading a tensor past the new end is an error naming the file and the tensor,
/// not a SIGBUS (the loader reads tensors, it does not map them).
#[test]
fn a_file_cut_after_opening_is_an_error_not_a_crash() {
    let dir = TempDir::new("cut-after-open");
    let tensors = tiny_tensors();
    let bytes = safetensors_of(&tensors, Dtype::F32);
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let store = WeightStore::open(dir.path()).unwrap();
    let names: Vec<String> = store.names().iter().map(|n| n.to_string()).collect();
    let whole: Vec<Vec<u8>> = names
        .iter()
        .map(|n| store.get(n).unwrap().read().unwrap())
        .collect();
    // Cut to the header only, in place (same inode, as `truncate` or an in-place rewrite does).
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(64.min(bytes.len() as u64)).unwrap();
    drop(file);
    for name in &names {
        let err = store.get(name).unwrap().read().unwrap_err();
        assert_eq!(err.kind(), "safetensors", "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("model.safetensors") && msg.contains(name),
            "{msg}"
        );
        assert!(store.get(name).unwrap().to_f32().is_err());
    }
    // Restored, the same handles read the same bytes again.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
        .unwrap();
    for (name, want) in names.iter().zip(&whole) {
        assert_eq!(&store.get(name).unwrap().read().unwrap(), want, "{name}");
    }
}
