//! The lab: variants and diagnostics kept to re-run investigations (written up under
//! `docs/investigations/`), apart from the product crates. Nothing here is library API.
//!
//! - [`add_variants`]: the element-wise add under other launch shapes and with inline-PTX cache
//!   operators;
//! - [`addlab`]: the add investigation's benchmark cases (the `lab` binary prints them as JSON
//!   lines, as `cubellm bench` does; `scripts/bench_torch.py --family addlab` times PyTorch's
//!   counterparts);
//! - [`samplelab`]: the device sampler's kernels against the argmax and the logits' copy they
//!   replace;
//! - [`persistent`]: the persistent decode step's weight stream (a shared-memory ring fed by
//!   bulk copies across stage ends, stages handed on through counters) written in CubeCL;
//! - [`persistent_gemv`]: the same kernel with real products, a chain of the step's bf16 GEMVs.

pub mod add_variants;
pub mod addlab;
pub mod persistent;
pub mod persistent_gemv;
pub mod samplelab;
