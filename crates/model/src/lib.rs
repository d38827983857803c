//! Qwen2 inference on CubeCL: `config.json`, safetensors weights (single or sharded,
//! memory-mapped), the tokenizer and chat template, a preallocated KV cache, sampling, and a
//! generation loop that streams text.
//!
//! ```text
//! config.rs     Qwen2Config / GenerationConfig from the HF JSON files (errors name the field)
//! weights.rs    WeightStore: mmap'ed safetensors by HF name, dtype conversion, upload
//! tokenizer.rs  Tokenizer (tokenizers crate), ChatTemplate (minijinja), StreamDecoder
//! sampling.rs   SamplingParams, Sampler (greedy / temperature / top-k / top-p / penalty, seeded)
//! kv_cache.rs   KvCache: per layer [max_len, Hkv, D] keys and values + a device length
//! qwen2.rs      Qwen2Model (weights, prefill, decode_step), DecodeBuffers, Qwen2Session
//! generate.rs   CausalLm trait, Generator, GenerateOptions, GenerationStats
//! hub.rs        model lookup: local dir, HF cache, download
//! demo.rs       the embedded demo model (tokenizer trained here, seeded-random weights)
//! ```
//!
//! The crate is generic over `R: cubecl::Runtime` and names no runtime.

pub mod config;
pub mod demo;
pub mod error;
pub mod generate;
pub mod hub;
pub mod kv_cache;
pub mod projection;
pub mod qwen2;
pub mod sampling;
pub mod tokenizer;
pub mod weights;

pub use config::{GenerationConfig, Qwen2Config};
pub use error::{ModelError, Result};
pub use generate::{
    CausalLm, GenerateOptions, GenerateOutput, GenerationStats, Generator, Prompt, StopReason,
};
pub use kv_cache::KvCache;
pub use qwen2::{
    choose_dtype, plan_weights, Compression, DecodeBuffers, Int4Group, LoadOptions, LoadProgress,
    LoadReport, Logits, QuantMode, Qwen2Model, Qwen2Session,
};
pub use sampling::{Sampler, SamplingParams};
pub use tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
pub use weights::WeightStore;
