//! `config.json` and `generation_config.json` of a Qwen2 checkpoint.
//!
//! Parsed from a `serde_json::Value` by hand rather than with a derived struct so that every
//! error names the field (a derived struct reports "missing field" without the file, and
//! "invalid type" without saying which of the twenty fields it was).
//!
//! Required: `hidden_size`, `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
//! `vocab_size` (they fix every tensor shape; guessing them would only move the error to the
//! weights). Optional, with the defaults of transformers' `Qwen2Config`: `num_key_value_heads`
//! (= heads), `head_dim` (= hidden / heads), `max_position_embeddings` (32768), `rope_theta`
//! (10000, also read from transformers 5's `rope_parameters`), `rms_norm_eps` (1e-6),
//! `tie_word_embeddings` (false), `hidden_act` ("silu", the only one accepted), the dtype
//! (`torch_dtype`, or `dtype` as transformers 5 writes it; f32 when absent, as in transformers).
//!
//! Sliding-window attention: Qwen2 checkpoints carry `sliding_window` / `max_window_layers`, but
//! the released Qwen2, Qwen2.5 and DeepSeek-R1-Distill models ship `use_sliding_window: false`,
//! and transformers then attends to the full context. We record the window only when it is in
//! force (`use_sliding_window: true`, or `layer_types` naming `sliding_attention`) and
//! [`Qwen2Config::check_context`] refuses a context longer than it, since the kernels implement
//! full causal attention only; within the window both are the same computation.
//!
//! RoPE scaling (`rope_scaling` / `rope_parameters.rope_type` other than `default`, e.g. YaRN)
//! is refused: the kernels implement the plain rotary embedding only.

use std::path::{Path, PathBuf};

use ops::DType;
use serde_json::Value;

use crate::error::{read_json, ModelError, Result};

/// The architectures we load. `Qwen2Model` is the headless base class: its checkpoints name
/// tensors without the `model.` prefix and have no `lm_head`, so they need tied embeddings.
pub const SUPPORTED_ARCHITECTURES: [&str; 2] = ["Qwen2ForCausalLM", "Qwen2Model"];

/// Everything of `config.json` that the Qwen2 forward pass uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2Config {
    /// The architecture name found in `architectures` (or `Qwen2ForCausalLM` when only
    /// `model_type: "qwen2"` is given).
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// The dtype the checkpoint declares (its tensors may still differ; the loader converts).
    pub dtype: DType,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// `(window, first sliding layer)` when sliding-window attention is in force.
    pub sliding_window: Option<(usize, usize)>,
}

/// Reads a field of a JSON object with errors that name it.
struct Fields<'a> {
    obj: &'a serde_json::Map<String, Value>,
    path: &'a Path,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, path: &'a Path) -> Result<Self> {
        let obj = value.as_object().ok_or_else(|| ModelError::Json {
            path: path.to_path_buf(),
            detail: "expected a JSON object at the top level".into(),
        })?;
        Ok(Self { obj, path })
    }

    /// The value, treating JSON `null` as absent (transformers writes `null` for unset fields).
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    fn err(&self, field: &str, detail: impl Into<String>) -> ModelError {
        ModelError::config(self.path, field, detail)
    }

    fn usize_opt(&self, field: &str) -> Result<Option<usize>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                self.err(field, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    /// A required positive integer.
    fn positive(&self, field: &str) -> Result<usize> {
        match self.usize_opt(field)? {
            None => Err(self.err(field, "missing (required)")),
            Some(0) => Err(self.err(field, "must be positive")),
            Some(n) => Ok(n),
        }
    }

    fn positive_or(&self, field: &str, default: usize) -> Result<usize> {
        match self.usize_opt(field)? {
            None => Ok(default),
            Some(0) => Err(self.err(field, "must be positive")),
            Some(n) => Ok(n),
        }
    }

    fn f64_or(&self, field: &str, default: f64) -> Result<f64> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    fn bool_or(&self, field: &str, default: bool) -> Result<bool> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    fn str_opt(&self, field: &str) -> Result<Option<&'a str>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    /// A token id field that may be an integer or a list of integers (`eos_token_id`).
    fn token_ids(&self, field: &str) -> Result<Vec<u32>> {
        let bad = || self.err(field, "expected a token id or a list of token ids");
        let one = |v: &Value| -> Result<u32> {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(bad)
        };
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(one).collect(),
            Some(v) => Ok(vec![one(v)?]),
        }
    }
}

/// Parses a `torch_dtype` string (`"bfloat16"`, `"float16"`, `"float32"`, also `"bf16"` etc.).
pub fn parse_torch_dtype(s: &str) -> Option<DType> {
    match s.trim_start_matches("torch.") {
        "bfloat16" | "bf16" => Some(DType::BF16),
        "float16" | "half" | "f16" | "fp16" => Some(DType::F16),
        "float32" | "float" | "f32" | "fp32" => Some(DType::F32),
        _ => None,
    }
}

impl Qwen2Config {
    /// Reads `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("config.json"))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let value = read_json(path)?;
        Self::from_value(&value, path)
    }

    /// Parses an already-read `config.json`; `path` is only used in error messages.
    pub fn from_value(value: &Value, path: &Path) -> Result<Self> {
        let f = Fields::new(value, path)?;

        let architecture = match f.get("architectures") {
            Some(Value::Array(list)) if !list.is_empty() => {
                let names: Vec<&str> = list.iter().filter_map(Value::as_str).collect();
                match names.iter().find(|n| SUPPORTED_ARCHITECTURES.contains(n)) {
                    Some(n) => n.to_string(),
                    None => {
                        return Err(ModelError::UnsupportedArchitecture {
                            path: path.to_path_buf(),
                            arch: names.join(", "),
                        })
                    }
                }
            }
            Some(Value::Array(_)) | None => match f.str_opt("model_type")? {
                Some("qwen2") => "Qwen2ForCausalLM".to_string(),
                Some(other) => {
                    return Err(ModelError::UnsupportedArchitecture {
                        path: path.to_path_buf(),
                        arch: format!("model_type {other}"),
                    })
                }
                None => {
                    return Err(f.err(
                        "architectures",
                        "missing (and no model_type either): cannot tell the architecture",
                    ))
                }
            },
            Some(v) => return Err(f.err("architectures", format!("expected a list, found {v}"))),
        };
        if let Some(mt) = f.str_opt("model_type")? {
            if mt != "qwen2" {
                return Err(ModelError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    arch: format!("{architecture} with model_type {mt}"),
                });
            }
        }

        let hidden_size = f.positive("hidden_size")?;
        let intermediate_size = f.positive("intermediate_size")?;
        let num_hidden_layers = f.positive("num_hidden_layers")?;
        let num_attention_heads = f.positive("num_attention_heads")?;
        let vocab_size = f.positive("vocab_size")?;
        let num_key_value_heads = f.positive_or("num_key_value_heads", num_attention_heads)?;
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(f.err(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
            ));
        }
        let head_dim = match f.usize_opt("head_dim")? {
            Some(0) => return Err(f.err("head_dim", "must be positive")),
            Some(d) => d,
            None => {
                if hidden_size % num_attention_heads != 0 {
                    return Err(f.err(
                        "hidden_size",
                        format!("{hidden_size} is not a multiple of num_attention_heads {num_attention_heads} (and no head_dim is given)"),
                    ));
                }
                hidden_size / num_attention_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(f.err(
                "head_dim",
                format!("{head_dim} is odd; RoPE needs an even head_dim"),
            ));
        }
        let max_position_embeddings = f.positive_or("max_position_embeddings", 32768)?;

        if let Some(act) = f.str_opt("hidden_act")? {
            if act != "silu" {
                return Err(f.err(
                    "hidden_act",
                    format!("'{act}' is not supported (only silu)"),
                ));
            }
        }

        // RoPE: transformers 4 writes rope_theta (+ rope_scaling); transformers 5 writes
        // rope_parameters { rope_type, rope_theta }.
        let mut rope_theta = f.f64_or("rope_theta", 10000.0)?;
        for field in ["rope_scaling", "rope_parameters"] {
            if let Some(v) = f.get(field) {
                let obj = v
                    .as_object()
                    .ok_or_else(|| f.err(field, format!("expected an object, found {v}")))?;
                let kind = obj
                    .get("rope_type")
                    .or_else(|| obj.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if kind != "default" {
                    return Err(f.err(
                        field,
                        format!("rope type '{kind}' is not supported (only the default rotary embedding)"),
                    ));
                }
                if let Some(t) = obj.get("rope_theta").filter(|t| !t.is_null()) {
                    rope_theta = t.as_f64().ok_or_else(|| {
                        f.err(
                            &format!("{field}.rope_theta"),
                            format!("expected a number, found {t}"),
                        )
                    })?;
                }
            }
        }
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(f.err(
                "rope_theta",
                format!("{rope_theta} must be positive and finite"),
            ));
        }
        let rms_norm_eps = f.f64_or("rms_norm_eps", 1e-6)?;
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            return Err(f.err(
                "rms_norm_eps",
                format!("{rms_norm_eps} must be positive and finite"),
            ));
        }
        let tie_word_embeddings = f.bool_or("tie_word_embeddings", false)?;

        let dtype_field = if f.get("torch_dtype").is_some() {
            "torch_dtype"
        } else {
            "dtype"
        };
        let dtype = match f.str_opt(dtype_field)? {
            None => DType::F32,
            Some(s) => parse_torch_dtype(s).ok_or_else(|| {
                f.err(
                    dtype_field,
                    format!("'{s}' is not one of bfloat16, float16, float32"),
                )
            })?,
        };

        let bos_token_id = f.token_ids("bos_token_id")?.first().copied();
        let eos_token_ids = f.token_ids("eos_token_id")?;

        let sliding_window = Self::sliding_window(&f, num_hidden_layers)?;

        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings,
            vocab_size,
            rope_theta,
            rms_norm_eps,
            tie_word_embeddings,
            dtype,
            bos_token_id,
            eos_token_ids,
            sliding_window,
        })
    }

    fn sliding_window(f: &Fields, layers: usize) -> Result<Option<(usize, usize)>> {
        let first_sliding = if let Some(types) = f.get("layer_types") {
            let list = types
                .as_array()
                .ok_or_else(|| f.err("layer_types", "expected a list of strings"))?;
            if list.len() != layers {
                return Err(f.err(
                    "layer_types",
                    format!("{} entries for {layers} layers", list.len()),
                ));
            }
            let mut first = None;
            for (i, t) in list.iter().enumerate() {
                match t.as_str() {
                    Some("full_attention") => {}
                    Some("sliding_attention") => {
                        first.get_or_insert(i);
                    }
                    _ => {
                        return Err(f.err(
                            "layer_types",
                            format!(
                                "entry {i} is {t} (expected full_attention or sliding_attention)"
                            ),
                        ))
                    }
                }
            }
            first
        } else if f.bool_or("use_sliding_window", false)? {
            let first = f.usize_opt("max_window_layers")?.unwrap_or(0);
            (first < layers).then_some(first)
        } else {
            None
        };
        match first_sliding {
            None => Ok(None),
            Some(first) => match f.usize_opt("sliding_window")? {
                // transformers treats a missing window as "no sliding".
                None => Ok(None),
                Some(w) => Ok(Some((w, first))),
            },
        }
    }

    /// Query heads per KV head (GQA group size).
    pub fn kv_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Width of the concatenated query heads (`num_attention_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of the concatenated key (or value) heads.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Parameter count (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let attn = h * self.q_dim()
            + self.q_dim()
            + 2 * (h * self.kv_dim() + self.kv_dim())
            + self.q_dim() * h;
        let layer = attn + 3 * h * i + 2 * h;
        let head = if self.tie_word_embeddings { 0 } else { v * h };
        v * h + self.num_hidden_layers * layer + h + head
    }

    /// Errors if a context of `max_len` tokens is one this model cannot attend over correctly.
    pub fn check_context(&self, max_len: usize, path: &Path) -> Result<()> {
        if let Some((window, first)) = self.sliding_window {
            if max_len > window {
                return Err(ModelError::config(
                    path,
                    "sliding_window",
                    format!(
                        "layers {first}.. use sliding-window attention of {window} tokens, which is not \
                         implemented; use a context of at most {window} tokens (--max-len)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The parts of `generation_config.json` that generation uses. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Sampling defaults the model's authors recommend (`do_sample: false` means greedy).
    pub do_sample: Option<bool>,
    pub temperature: Option<f64>,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

impl GenerationConfig {
    /// Reads `<dir>/generation_config.json`; a missing file gives the empty config.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("generation_config.json");
        if !path.exists() {
            return Ok(Self::default());
        }
        let value = read_json(&path)?;
        Self::from_value(&value, &path)
    }

    pub fn from_value(value: &Value, path: &Path) -> Result<Self> {
        let f = Fields::new(value, path)?;
        let bool_opt = |field: &str| -> Result<Option<bool>> {
            match f.get(field) {
                None => Ok(None),
                Some(v) => v
                    .as_bool()
                    .map(Some)
                    .ok_or_else(|| f.err(field, "expected true or false")),
            }
        };
        let f64_opt = |field: &str| -> Result<Option<f64>> {
            match f.get(field) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| f.err(field, "expected a number")),
            }
        };
        Ok(Self {
            bos_token_id: f.token_ids("bos_token_id")?.first().copied(),
            eos_token_ids: f.token_ids("eos_token_id")?,
            do_sample: bool_opt("do_sample")?,
            temperature: f64_opt("temperature")?,
            top_k: f.usize_opt("top_k")?,
            top_p: f64_opt("top_p")?,
            repetition_penalty: f64_opt("repetition_penalty")?,
        })
    }
}

/// A model directory's paths, for messages.
pub(crate) fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}
