//! The engine: everything that runs a model and knows no family.
//!
//! It loads any architecture of [`crate::models`] through its [`crate::ModelConfig`] (the
//! family's config mapping and decoder block), and owns what is the same for all of them:
//!
//! ```text
//! plan.rs         plan_weights: every tensor checked on the host (presence, shape, dtype), grouped
//!                 into device tensors by name, before anything is uploaded
//! load.rs         Model::load: dtype policy (choose_dtype), uploads in plan order, LoadOptions
//! memory.rs       MemoryPlan: device bytes from the config, checked before any allocation
//! compression.rs  Compression / QuantMode / Int4Group: projections as Box<dyn ops::linear::Linear>
//! projection.rs   Projection (dense or compressed, with its bias), Weight, ProjectionScratch
//! screen.rs       the screened LM head of greedy decoding: an int8 copy and its error bounds
//! kv_cache.rs     KvCache: per layer [max_len, Hkv, D]; one source of truth for its length
//! buffers.rs      Activations, DecodeBuffers (everything the decode step writes), StepContext
//! model.rs        Model: weights, prefill and the allocation-free decode step, one forward
//! device_lock.rs  the process-wide lock that keeps other sessions' device work out of a capture
//! session.rs      Session (model + cache + buffers): CausalLm, CUDA-graph capture and replay
//! batch.rs        SlotCache, BatchBuffers, BatchSession: several sequences decoded together
//!                 (continuous batching's device side), a graph per row count
//! ```
//!
//! The decode step allocates nothing and reads its token, position and cache length from
//! device buffers, so it is captured once as a CUDA graph and replayed (first step eager,
//! second captured, replays after; a failed capture falls back to eager steps, and models with
//! block-sparse projections, whose kernel allocates, always run eagerly); once per rung of
//! cache rows its attention is planned for, where the cache is longer than the first rung
//! (`session::plan_rows`).

pub mod batch;
pub mod buffers;
pub mod compression;
pub(crate) mod device_lock;
pub mod kv_cache;
pub mod load;
pub mod memory;
pub mod model;
pub mod plan;
pub mod projection;
pub mod screen;
pub mod session;
