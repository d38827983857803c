//! The persistent compilation cache: compiled kernels kept on disk between runs, so that a second
//! `generate` (or a restarted server) skips CubeCL's code generation and NVRTC.
//!
//! CubeCL stores compiled PTX per GPU architecture, keyed by the kernel and the build id of the
//! running binary (a rebuilt binary never loads another build's kernels). Only CUDA persists
//! anything: the wgpu runtime compiles WGSL through the driver on every run.
//!
//! CubeCL reads its configuration once per process, so [`configure`] must run before the first
//! client is created; it also leaves alone a configuration that a `cubecl.toml` or the
//! application already fixed.

use std::path::{Path, PathBuf};

use cubecl::config::cache::CacheConfig;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

/// Where compiled kernels go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// Compile every kernel in every run.
    Off,
    /// Keep them under this directory (created on first use).
    Dir(PathBuf),
}

impl KernelCache {
    /// `$XDG_CACHE_HOME/cubellm/kernels`, else `~/.cache/cubellm/kernels`; off when neither
    /// directory is known.
    pub fn default_location() -> Self {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::home_dir()
                    .filter(|h| !h.as_os_str().is_empty())
                    .map(|h| h.join(".cache"))
            });
        match base {
            Some(base) => Self::Dir(base.join("cubellm").join("kernels")),
            None => Self::Off,
        }
    }

    pub fn dir(&self) -> Option<&Path> {
        match self {
            Self::Off => None,
            Self::Dir(d) => Some(d),
        }
    }
}

/// What [`configure`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Configured {
    /// This process now uses `cache`.
    Applied,
    /// CubeCL's configuration was already fixed (a `cubecl.toml`, or an earlier call) and is
    /// kept as it is.
    AlreadySet,
}

/// Applies `cache` to CubeCL's process-wide configuration, on top of what a `cubecl.toml` in the
/// working directory or its parents and CubeCL's environment variables say (their other settings
/// are kept). Must run before the first client is created.
pub fn configure(cache: &KernelCache) -> Configured {
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    match cache {
        KernelCache::Off => config.compilation.cache = false,
        KernelCache::Dir(dir) => {
            config.compilation.cache = true;
            config.environment.path = CacheConfig::Directory(dir.clone());
        }
    }
    if CubeClRuntimeConfig::try_set(config) {
        Configured::Applied
    } else {
        Configured::AlreadySet
    }
}

/// Whether the process-wide configuration has the compilation cache on, and where its
/// environments live.
pub fn current() -> (bool, PathBuf) {
    let config = CubeClRuntimeConfig::get();
    (config.compilation.cache, config.environment.path.root())
}
