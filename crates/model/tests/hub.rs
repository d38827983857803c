//! Model lookup (local dir, HF cache layout, offline errors) and the compute dtype choice.

mod common;

use common::TempDir;
use model::hub::{
    find_in_hf_cache, looks_like_repo_id, missing_files, resolve_model_with, ModelSource,
};
use model::{choose_dtype, ModelError};
use ops::DType;

/// A fake HF cache holding `repo` at revision `rev` with the given files.
fn fake_cache(
    cache: &std::path::Path,
    repo: &str,
    rev: &str,
    files: &[&str],
    with_ref: bool,
) -> std::path::PathBuf {
    let repo_dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snap = repo_dir.join("snapshots").join(rev);
    std::fs::create_dir_all(&snap).unwrap();
    for f in files {
        std::fs::write(snap.join(f), "{}").unwrap();
    }
    if with_ref {
        std::fs::create_dir_all(repo_dir.join("refs")).unwrap();
        std::fs::write(repo_dir.join("refs").join("main"), format!("{rev}\n")).unwrap();
    }
    snap
}

const COMPLETE: [&str; 3] = ["config.json", "tokenizer.json", "model.safetensors"];

#[test]
fn repo_ids_and_paths() {
    for ok in [
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "gpt2",
    ] {
        assert!(looks_like_repo_id(ok), "{ok}");
    }
    for bad in [
        "./model",
        "/abs/path",
        "a/b/c",
        "../x",
        "a/..",
        "",
        "org/",
        "-x/y",
        "a b/c",
    ] {
        assert!(!looks_like_repo_id(bad), "{bad}");
    }
}

#[test]
fn a_local_directory_wins() {
    let dir = TempDir::new("local");
    let spec = dir.path().to_str().unwrap();
    assert_eq!(
        resolve_model_with(spec, None, true).unwrap(),
        ModelSource::Local(dir.path().to_path_buf())
    );
    // A path that does not exist (and is no repo id) says so.
    let err = resolve_model_with("/no/such/model/dir", None, true).unwrap_err();
    assert_eq!(err.kind(), "model-not-found");
    assert!(
        err.to_string().contains("/no/such/model/dir")
            && err.to_string().contains("no such directory"),
        "{err}"
    );
    // A file is not a model.
    std::fs::write(dir.join("file"), "x").unwrap();
    let err = resolve_model_with(dir.join("file").to_str().unwrap(), None, true).unwrap_err();
    assert!(err.to_string().contains("not a model directory"), "{err}");
}

#[test]
fn repo_ids_are_found_in_the_hf_cache() {
    let cache = TempDir::new("hfcache");
    let repo = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B";
    let snap = fake_cache(cache.path(), repo, "abc123", &COMPLETE, true);
    fake_cache(cache.path(), repo, "older", &COMPLETE, false);
    assert_eq!(find_in_hf_cache(repo, cache.path()), Some(snap.clone()));
    assert_eq!(
        resolve_model_with(repo, Some(cache.path()), true).unwrap(),
        ModelSource::HfCache {
            repo: repo.into(),
            dir: snap
        }
    );
    // Without refs/main the newest snapshot is taken.
    let other = "Qwen/Qwen2.5-0.5B";
    let snap = fake_cache(cache.path(), other, "r1", &COMPLETE, false);
    assert_eq!(find_in_hf_cache(other, cache.path()), Some(snap));
    assert_eq!(find_in_hf_cache("nobody/nothing", cache.path()), None);
}

#[test]
fn offline_and_incomplete_caches_are_clear_errors() {
    let cache = TempDir::new("hfcache-missing");
    let err = resolve_model_with("org/absent", Some(cache.path()), true).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("org/absent") && msg.contains("HF_HUB_OFFLINE") && !msg.contains('\n'),
        "{msg}"
    );
    // A snapshot with shards listed in an index but absent names them.
    let snap = fake_cache(
        cache.path(),
        "org/sharded",
        "r",
        &["config.json", "tokenizer.json"],
        true,
    );
    std::fs::write(
        snap.join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    std::fs::write(snap.join("model-00001-of-00002.safetensors"), "").unwrap();
    assert_eq!(
        missing_files(&snap),
        vec!["model-00002-of-00002.safetensors".to_string()]
    );
    let err = resolve_model_with("org/sharded", Some(cache.path()), true).unwrap_err();
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );
    // No cache location at all.
    let err = resolve_model_with("org/x", None, true).unwrap_err();
    assert!(err.to_string().contains("HF_HOME"), "{err}");
}

#[test]
fn without_network_the_download_fails_cleanly() {
    // This machine (and CI) has no route to the Hub: the attempt must end in an error, not a
    // panic or a hang. Where a network exists the repo below does not, so it fails there too.
    let cache = TempDir::new("hfcache-download");
    let err = resolve_model_with(
        "cubellm-test-org/does-not-exist-0000",
        Some(cache.path()),
        false,
    )
    .unwrap_err();
    assert!(matches!(err, ModelError::ModelNotFound { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("does-not-exist-0000") && !msg.contains('\n'),
        "{msg}"
    );
}

#[test]
fn dtype_choice() {
    let cuda = |_: DType| true;
    let wgpu = |d: DType| d != DType::BF16;
    // The checkpoint's dtype where supported.
    assert_eq!(
        choose_dtype(None, DType::BF16, cuda, "cuda").unwrap(),
        (DType::BF16, None)
    );
    assert_eq!(
        choose_dtype(None, DType::F32, wgpu, "wgpu").unwrap(),
        (DType::F32, None)
    );
    // bf16 on wgpu: f16 with a one-line notice.
    let (d, notice) = choose_dtype(None, DType::BF16, wgpu, "wgpu").unwrap();
    assert_eq!(d, DType::F16);
    let notice = notice.unwrap();
    assert!(
        notice.contains("bf16") && notice.contains("f16") && !notice.contains('\n'),
        "{notice}"
    );
    // Explicit choices are obeyed, explicit bf16 on wgpu is an error.
    assert_eq!(
        choose_dtype(Some(DType::F32), DType::BF16, wgpu, "wgpu").unwrap(),
        (DType::F32, None)
    );
    let err = choose_dtype(Some(DType::BF16), DType::BF16, wgpu, "wgpu").unwrap_err();
    assert_eq!(err.kind(), "dtype");
    assert!(
        err.to_string().contains("bf16")
            && err.to_string().contains("wgpu")
            && err.to_string().contains("--dtype f16"),
        "{err}"
    );
    assert_eq!(
        choose_dtype(Some(DType::I8), DType::BF16, cuda, "cuda")
            .unwrap_err()
            .kind(),
        "parameter"
    );
}
