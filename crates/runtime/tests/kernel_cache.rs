//! The persistent kernel cache is switched on in CubeCL's process-wide configuration, once
//! (this file is its own test process: the configuration can be set only once per process).

use runtime::kernel_cache::{self, Configured, KernelCache};

#[test]
fn configure_turns_the_compilation_cache_on_once() {
    let dir = std::env::temp_dir().join(format!("cubellm-kernel-cache-{}", std::process::id()));
    assert_eq!(
        kernel_cache::configure(&KernelCache::Dir(dir.clone())),
        Configured::Applied
    );
    assert_eq!(kernel_cache::current(), (true, dir.clone()));
    // A second call keeps the first configuration.
    assert_eq!(
        kernel_cache::configure(&KernelCache::Off),
        Configured::AlreadySet
    );
    assert_eq!(kernel_cache::current(), (true, dir));
}

#[test]
fn the_default_location_follows_xdg_cache_home() {
    match KernelCache::default_location() {
        KernelCache::Dir(d) => assert!(d.ends_with("cubellm/kernels"), "{}", d.display()),
        KernelCache::Off => {
            assert!(
                std::env::var_os("HOME").is_none() && std::env::var_os("XDG_CACHE_HOME").is_none()
            )
        }
    }
}
