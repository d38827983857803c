//! Finding a model: a local directory, or a Hugging Face repo id in the standard HF cache
//! (downloaded with hf-hub when missing and the network allows).
//!
//! Cache location, as huggingface_hub resolves it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`; a repo `org/name` lives in `models--org--name/snapshots/<rev>/`,
//! with `refs/main` naming the revision. `HF_HUB_OFFLINE=1` forbids downloads.

use std::path::{Path, PathBuf};

use crate::error::{read_json, ModelError, Result};
use crate::weights::{INDEX_FILE, SINGLE_FILE};

/// The model used when none is named.
pub const DEFAULT_REPO: &str = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B";

/// Where a model was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A directory given by path.
    Local(PathBuf),
    /// A repo id found complete in the HF cache.
    HfCache { repo: String, dir: PathBuf },
    /// A repo id downloaded (completed) into the HF cache just now.
    Downloaded { repo: String, dir: PathBuf },
}

impl ModelSource {
    pub fn dir(&self) -> &Path {
        match self {
            Self::Local(d) => d,
            Self::HfCache { dir, .. } | Self::Downloaded { dir, .. } => dir,
        }
    }
}

fn home() -> Option<PathBuf> {
    std::env::home_dir().filter(|h| !h.as_os_str().is_empty())
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The HF hub cache directory (see the module docs).
pub fn hf_cache_dir() -> Option<PathBuf> {
    env_path("HF_HUB_CACHE")
        .or_else(|| env_path("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| home().map(|h| h.join(".cache").join("huggingface").join("hub")))
}

/// Whether downloads are disabled (`HF_HUB_OFFLINE` set to 1/true/yes/on).
pub fn hf_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// Whether `spec` has the shape of a Hub repo id (`org/name`, or `name`).
pub fn looks_like_repo_id(spec: &str) -> bool {
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && !s.starts_with('-')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let parts: Vec<&str> = spec.split('/').collect();
    match parts.as_slice() {
        [name] => ok(name) && !spec.contains(".."),
        [org, name] => ok(org) && ok(name) && !spec.contains(".."),
        _ => false,
    }
}

/// The shard files an index's `weight_map` names, sorted, each once.
fn shard_files(index: &serde_json::Value) -> Vec<String> {
    let mut shards: Vec<String> = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.values()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    shards.sort();
    shards.dedup();
    shards
}

/// Files of a model directory that are still missing (config, tokenizer, weights; shards
/// listed in the index included).
pub fn missing_files(dir: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    for f in ["config.json", "tokenizer.json"] {
        if !dir.join(f).is_file() {
            missing.push(f.to_string());
        }
    }
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        match read_json(&index) {
            Ok(json) => {
                missing.extend(
                    shard_files(&json)
                        .into_iter()
                        .filter(|s| !dir.join(s).is_file()),
                );
            }
            Err(_) => missing.push(INDEX_FILE.to_string()),
        }
    } else if !dir.join(SINGLE_FILE).is_file() {
        missing.push(SINGLE_FILE.to_string());
    }
    missing
}

/// The snapshot directory of `repo` in `cache`: the revision `refs/main` names, else the
/// most recently modified snapshot. `None` when the repo is not cached at all.
pub fn find_in_hf_cache(repo: &str, cache: &Path) -> Option<PathBuf> {
    let repo_dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshots = repo_dir.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo_dir.join("refs").join("main")) {
        let dir = snapshots.join(rev.trim());
        if dir.is_dir() {
            return Some(dir);
        }
    }
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in std::fs::read_dir(&snapshots).ok()?.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        let modified = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(std::time::SystemTime::UNIX_EPOCH);
        if best.as_ref().is_none_or(|(t, _)| modified > *t) {
            best = Some((modified, path));
        }
    }
    best.map(|(_, p)| p)
}

/// A cached snapshot of `repo` that has every file the loader needs.
pub fn find_complete_in_hf_cache(repo: &str) -> Option<PathBuf> {
    let dir = find_in_hf_cache(repo, &hf_cache_dir()?)?;
    missing_files(&dir).is_empty().then_some(dir)
}

/// Resolves a model given as a directory or a Hub repo id.
///
/// An existing directory wins. Otherwise a repo id is looked up in the HF cache and, where
/// files are missing, downloaded (unless `HF_HUB_OFFLINE` is set or the `download` feature is
/// off). Anything else is an error naming what was tried.
pub fn resolve_model(spec: &str) -> Result<ModelSource> {
    resolve_model_with(spec, hf_cache_dir().as_deref(), hf_offline())
}

/// [`resolve_model`] with the cache directory and the offline switch given explicitly.
pub fn resolve_model_with(spec: &str, cache: Option<&Path>, offline: bool) -> Result<ModelSource> {
    let path = Path::new(spec);
    if path.is_dir() {
        return Ok(ModelSource::Local(path.to_path_buf()));
    }
    let not_found = |detail: String| ModelError::ModelNotFound {
        spec: spec.to_string(),
        detail,
    };
    if path.exists() {
        return Err(not_found("is a file, not a model directory".into()));
    }
    if !looks_like_repo_id(spec) {
        return Err(not_found("no such directory".into()));
    }
    let cache = cache.ok_or_else(|| {
        not_found("no such directory, and no HF cache location (set HF_HOME or HOME)".into())
    })?;
    let cached = find_in_hf_cache(spec, cache);
    let missing = match &cached {
        Some(dir) => missing_files(dir),
        None => vec!["config.json".into()],
    };
    if let (Some(dir), true) = (&cached, missing.is_empty()) {
        return Ok(ModelSource::HfCache {
            repo: spec.to_string(),
            dir: dir.clone(),
        });
    }
    let where_ = match &cached {
        Some(dir) => format!(
            "the cached snapshot {} lacks {}",
            dir.display(),
            missing.join(", ")
        ),
        None => format!(
            "no such directory and not in the HF cache {}",
            cache.display()
        ),
    };
    if offline {
        return Err(not_found(format!(
            "{where_} (HF_HUB_OFFLINE is set, so nothing was downloaded)"
        )));
    }
    download(spec, cache).map_err(|e| not_found(format!("{where_}, and the download failed: {e}")))
}

#[cfg(feature = "download")]
fn download(repo: &str, cache: &Path) -> std::result::Result<ModelSource, String> {
    use hf_hub::api::sync::ApiBuilder;
    let api = ApiBuilder::new()
        .with_cache_dir(cache.to_path_buf())
        .with_progress(true)
        .build()
        .map_err(|e| e.to_string())?;
    let repo_api = api.model(repo.to_string());
    let one_line = |e: hf_hub::api::sync::ApiError| e.to_string().replace('\n', " ");
    let config = repo_api.get("config.json").map_err(one_line)?;
    let dir = config
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| "download returned no directory".to_string())?;
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        // tokenizer_config / generation_config are optional: their absence is not an error.
        if let Err(e) = repo_api.get(f) {
            if f == "tokenizer.json" {
                return Err(one_line(e));
            }
        }
    }
    match repo_api.get(INDEX_FILE) {
        Ok(index) => {
            let json = read_json(&index).map_err(|e| e.to_string())?;
            for s in shard_files(&json) {
                repo_api.get(&s).map_err(one_line)?;
            }
        }
        Err(_) => {
            repo_api.get(SINGLE_FILE).map_err(one_line)?;
        }
    }
    Ok(ModelSource::Downloaded {
        repo: repo.to_string(),
        dir,
    })
}

#[cfg(not(feature = "download"))]
fn download(_repo: &str, _cache: &Path) -> std::result::Result<ModelSource, String> {
    Err(
        "this build has no download support (the 'download' feature of cubellm-model is off)"
            .into(),
    )
}
