//! The patched CUDA runtime's coherent inputs (`vendor/cubecl-cuda/PATCHED.md`): in a kernel that
//! places its own `griddepcontrol.wait`, the `const` pointer parameters it does not name as read
//! before the wait lose `__restrict__`. The source rewriting is std only, so its own unit tests
//! run here, on every machine, without a GPU.

#[path = "../../../vendor/cubecl-cuda/src/pdl/coherent.rs"]
mod coherent;
#[path = "../../../vendor/cubecl-cuda/src/pdl/entry.rs"]
mod entry;
