//! Loading checkpoints of every family onto the device: uploads equal the checkpoint, the dtype
//! policy, and load errors that name the field or the tensor.

use cubecl::prelude::*;
use model::{LoadOptions, Model};
use ops::{caps, DType};
use testkit::on_each_runtime_one_cuda_at_a_time;

use crate::{assert_weights_match, fixture, load, Demo};

fn demo_loads<R: Runtime>(client: &ComputeClient<R>) {
    let demo = Demo::new();
    let (m, report) = load(client, &demo.0, &LoadOptions::default()).unwrap();
    assert_eq!(report.dtype, DType::F32);
    assert_eq!(report.checkpoint_dtype, DType::F32);
    assert!(report.notices.is_empty(), "{:?}", report.notices);
    assert_eq!(report.max_len, model::demo::MAX_POSITIONS);
    assert_eq!(m.layers.len(), model::demo::LAYERS);
    assert!(m.lm_head.is_none(), "tied embeddings use embed_tokens");
    assert!(m
        .layers
        .iter()
        .all(|l| l.q_norm.is_none() && !l.o_proj.has_bias()));
    assert_eq!(report.weight_bytes, report.dense_weight_bytes);
    assert_eq!(
        m.layers[1].qkv_proj.parts(),
        ["q", "k", "v"].map(|p| format!("model.layers.1.self_attn.{p}_proj.weight"))
    );
    assert_weights_match(client, &m, &demo.0);
    // f16 on request: converted on the host.
    let (m, report) = load(
        client,
        &demo.0,
        &LoadOptions {
            dtype: Some(DType::F16),
            max_len: Some(64),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!((report.dtype, report.max_len), (DType::F16, 64));
    assert_weights_match(client, &m, &demo.0);
}

#[test]
fn demo_model_loads_on_every_runtime() {
    on_each_runtime_one_cuda_at_a_time!(demo_loads);
}

fn bf16_checkpoint_dtype_policy<R: Runtime>(client: &ComputeClient<R>) {
    let dir = fixture("qwen2-gqa-untied");
    let (m, report) = load(client, &dir, &LoadOptions::default()).unwrap();
    assert_eq!(report.checkpoint_dtype, DType::BF16);
    if caps::supports_dtype(client, DType::BF16) {
        assert_eq!(report.dtype, DType::BF16);
        assert!(report.notices.is_empty());
    } else {
        // wgpu: f16 with a one-line notice, and an explicit bf16 is an error.
        assert_eq!(report.dtype, DType::F16);
        assert_eq!(report.notices.len(), 1, "{:?}", report.notices);
        assert!(report.notices[0].contains("bf16"));
        let err = load(
            client,
            &dir,
            &LoadOptions {
                dtype: Some(DType::BF16),
                max_len: None,
                ..LoadOptions::default()
            },
        )
        .unwrap_err();
        assert_eq!(err.kind(), "dtype", "{err}");
        assert!(!err.to_string().contains('\n'));
    }
    assert!(m.lm_head.is_some(), "untied");
    assert_weights_match(client, &m, &dir);
    let (m, _) = load(
        client,
        &dir,
        &LoadOptions {
            dtype: Some(DType::F32),
            max_len: None,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_weights_match(client, &m, &dir);
    // Loading errors surface before anything is uploaded.
    let err = load(
        client,
        std::path::Path::new("/no/model/here"),
        &LoadOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), "io");
    let err = load(
        client,
        &dir,
        &LoadOptions {
            dtype: None,
            max_len: Some(0),
            ..LoadOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(err.kind(), "parameter");
}

#[test]
fn bf16_checkpoints_follow_the_dtype_policy() {
    on_each_runtime_one_cuda_at_a_time!(bf16_checkpoint_dtype_policy);
}

/// The Qwen3 and Llama fixtures load with the tensors their blocks need, each equal to the
/// checkpoint's values (fused ones by their parts).
fn families_load<R: Runtime>(client: &ComputeClient<R>) {
    for (name, qk_norm, qkv_bias, o_bias, tied) in [
        ("qwen3-gqa-tied", true, false, false, true),
        ("qwen3-mha-untied", true, false, false, false),
        ("llama3-rope-scaled", false, false, false, true),
        ("llama-bias-untied", false, true, true, false),
    ] {
        let dir = fixture(name);
        let opts = LoadOptions {
            dtype: Some(DType::F32),
            ..LoadOptions::default()
        };
        let (m, report) = load(client, &dir, &opts).unwrap();
        assert!(report.notices.is_empty(), "{name}: {:?}", report.notices);
        assert_eq!(m.lm_head.is_none(), tied, "{name}");
        for l in &m.layers {
            assert_eq!(l.q_norm.is_some() && l.k_norm.is_some(), qk_norm, "{name}");
            assert_eq!(l.qkv_proj.has_bias(), qkv_bias, "{name}");
            assert_eq!(l.o_proj.has_bias(), o_bias, "{name}");
        }
        assert_eq!(
            m.rope.inv_freq,
            m.config()
                .rope_scaling
                .inv_freq(m.config().head_dim, m.config().rope_theta),
            "{name}"
        );
        assert_weights_match(client, &m, &dir);
    }
}

#[test]
fn every_family_loads_its_tensors() {
    on_each_runtime_one_cuda_at_a_time!(families_load);
}

/// A copy of a fixture with `edit` applied to its config.json.
fn edited_fixture(name: &str, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Demo {
    let src = fixture(name);
    let dir = Demo::empty(tag);
    for f in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(f.path(), dir.0.join(f.file_name())).unwrap();
    }
    let path = dir.0.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

fn load_errors<R: Runtime>(client: &ComputeClient<R>) {
    let load_err = |dir: &std::path::Path| {
        Model::<R>::load(client, dir, &LoadOptions::default(), &mut |_| {}).unwrap_err()
    };
    let dir = edited_fixture("llama-bias-untied", "mlp-bias", |c| {
        c["mlp_bias"] = true.into();
    });
    let err = load_err(&dir.0);
    assert_eq!(err.kind(), "config", "{err}");
    assert!(err.to_string().contains("mlp_bias"), "{err}");
    let dir = edited_fixture("llama3-rope-scaled", "rope-type", |c| {
        c["rope_parameters"]["rope_type"] = "longrope".into();
    });
    let err = load_err(&dir.0);
    assert!(
        err.to_string().contains("rope_parameters") && err.to_string().contains("longrope"),
        "{err}"
    );
    // A Qwen3 config on a checkpoint without q/k norms names the first missing tensor.
    let dir = edited_fixture("qwen2-1layer", "qwen3-on-qwen2", |c| {
        c["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
        c["model_type"] = "qwen3".into();
        c["head_dim"] = 32.into();
    });
    let err = load_err(&dir.0);
    assert_eq!(err.kind(), "missing-tensor", "{err}");
    assert!(
        err.to_string()
            .contains("model.layers.0.self_attn.q_norm.weight"),
        "{err}"
    );
}

#[test]
fn load_errors_name_the_field_or_tensor() {
    on_each_runtime_one_cuda_at_a_time!(load_errors);
}
