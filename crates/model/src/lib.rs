//! LLM inference on CubeCL for the Qwen2, Qwen3 and Llama families: `config.json`, safetensors
//! weights (single or sharded, read tensor by tensor), the tokenizer and chat template, a preallocated
//! KV cache, sampling, and a generation loop that streams text.
//!
//! The architectures are kept apart from the engine that runs them: [`models`] says what a
//! family is (its config mapping, its tensors by Hugging Face name and how they are fused, the
//! shared decoder block and its one layer forward), [`engine`] loads, caches, buffers, captures
//! and generates for any of them.
//!
//! ```text
//! config.rs     ModelConfig / GenerationConfig from the HF JSON files (errors name the field)
//! models/       Architecture registry; qwen2.rs, qwen3.rs, llama.rs; decoder.rs (the shared block)
//! engine/       plan, load, compression, projections, KV cache, buffers, Model, Session
//! weights.rs    WeightStore: safetensors by HF name (positioned reads), dtype conversion, upload
//! tokenizer.rs  Tokenizer (tokenizers crate), ChatTemplate (minijinja), StreamDecoder
//! sampling.rs   SamplingParams, Sampler (greedy / temperature / top-k / top-p / penalty, seeded)
//! generate.rs   CausalLm trait, Generator, GenerateOptions, GenerationStats
//! hub.rs        model lookup: local dir, HF cache, download
//! demo.rs       the embedded demo model (tokenizer trained here, seeded-random weights)
//! ```
//!
//! The crate is generic over `R: cubecl::Runtime` and names no runtime.

pub mod config;
pub mod demo;
pub mod engine;
pub mod error;
pub mod generate;
pub mod hub;
pub mod models;
pub mod sampling;
pub mod tokenizer;
pub mod weights;

pub use config::{GenerationConfig, ModelConfig};
pub use engine::batch::{BatchBuffers, BatchLm, BatchSession, SlotCache};
pub use engine::buffers::{Activations, DecodeBuffers};
pub use engine::compression::{Compression, Decode8, Int4Group, QuantMode};
pub use engine::kv_cache::KvCache;
pub use engine::load::{choose_dtype, LoadOptions, LoadProgress, LoadReport, DEFAULT_MAX_LEN};
pub use engine::memory::{DeviceMemory, MemoryPlan};
pub use engine::model::{Logits, Model};
pub use engine::plan::{plan_weights, WeightPlan};
pub use engine::session::{Session, SessionOptions};
pub use error::{ModelError, Result};
pub use generate::{
    CausalLm, GenerateOptions, GenerateOutput, GenerationStats, Generator, Prompt, Sequence,
    StopReason,
};
pub use models::Architecture;
pub use sampling::{Sampler, SamplingParams};
pub use tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
pub use weights::WeightStore;
