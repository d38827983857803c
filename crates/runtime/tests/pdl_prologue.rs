//! The patched CUDA runtime's programmatic-dependent-launch prologue
//! (`vendor/cubecl-cuda/PATCHED.md`): its source rewriting and PTX checks are std only, so its
//! own unit tests run here, on every machine, without a GPU.

#[path = "../../../vendor/cubecl-cuda/src/pdl/entry.rs"]
mod entry;
#[path = "../../../vendor/cubecl-cuda/src/pdl/prologue.rs"]
mod prologue;
