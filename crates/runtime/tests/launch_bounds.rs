//! The patched CUDA runtime's occupancy request (`vendor/cubecl-cuda/PATCHED.md`): a kernel's
//! cubes-per-SM marker becomes its entry point's launch bounds. The source rewriting is std only,
//! so its own unit tests run here, on every machine, without a GPU.

#[path = "../../../vendor/cubecl-cuda/src/pdl/entry.rs"]
mod entry;
#[path = "../../../vendor/cubecl-cuda/src/pdl/launch_bounds.rs"]
mod launch_bounds;
