//! `config.json` and `generation_config.json`: the hyperparameters every supported family
//! shares ([`ModelConfig`]), read with errors that name the file and the field.
//!
//! Which family a checkpoint is (`architectures`, else `model_type`) and each family's fields
//! and defaults (as transformers defines its config classes) live in [`crate::models`]; this
//! module holds the reader they use and the parts they share.
//!
//! Parsed from a `serde_json::Value` by hand rather than with a derived struct so that every
//! error names the field (a derived struct reports "missing field" without the file, and
//! "invalid type" without saying which of the twenty fields it was).
//!
//! Required: `hidden_size`, `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
//! `vocab_size` (they fix every tensor shape; guessing them would only move the error to the
//! weights). Shared optional fields: `rms_norm_eps` (1e-6), `tie_word_embeddings` (false),
//! `hidden_act` ("silu", the only one accepted), the dtype (`torch_dtype`, or `dtype` as
//! transformers 5 writes it; f32 when absent, as in transformers), `bos_token_id` /
//! `eos_token_id`, and the rotary embedding.
//!
//! RoPE: transformers 4 writes `rope_theta` (10000 when absent) and `rope_scaling`; transformers
//! 5 writes `rope_parameters { rope_type, rope_theta, .. }` (the dict's values win, and a
//! `rope_scaling` dict replaces it). `rope_type` `default` and `llama3` (`factor`,
//! `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`, the last
//! defaulting to `max_position_embeddings`) are implemented; every other type (YaRN, linear,
//! dynamic, ...) and a partial rotary factor are refused, since the tables would be wrong.
//!
//! Sliding-window attention (Qwen2, Qwen3): checkpoints carry `sliding_window` /
//! `max_window_layers`, but the released models ship `use_sliding_window: false`, and
//! transformers then attends to the full context. We record the window only when it is in
//! force (`use_sliding_window: true`, or `layer_types` naming `sliding_attention`) and
//! [`ModelConfig::check_context`] refuses a context longer than it, since the kernels implement
//! full causal attention only; within the window both are the same computation.

use std::path::{Path, PathBuf};

use ops::rope::RopeScaling;
use ops::DType;
use serde_json::Value;

use crate::error::{read_json, ModelError, Result};
use crate::models::decoder::DecoderBlock;

/// Everything of `config.json` that the forward pass uses, for every supported family.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The transformers class found in `architectures` (or the family's causal LM class when
    /// only `model_type` is given).
    pub architecture: String,
    /// The family's `model_type` (`"qwen2"`, `"qwen3"`, `"llama"`).
    pub model_type: &'static str,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// The dtype the checkpoint declares (its tensors may still differ; the loader converts).
    pub dtype: DType,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// `(window, first sliding layer)` when sliding-window attention is in force.
    pub sliding_window: Option<(usize, usize)>,
    /// What each decoder layer holds besides the shared pre-norm block (biases, q/k norms).
    pub block: DecoderBlock,
}

/// Reads a field of a JSON object with errors that name it.
pub struct Fields<'a> {
    obj: &'a serde_json::Map<String, Value>,
    path: &'a Path,
}

impl<'a> Fields<'a> {
    pub fn new(value: &'a Value, path: &'a Path) -> Result<Self> {
        let obj = value.as_object().ok_or_else(|| ModelError::Json {
            path: path.to_path_buf(),
            detail: "expected a JSON object at the top level".into(),
        })?;
        Ok(Self { obj, path })
    }

    /// Whether the field is in the file at all (`null` included): transformers' dataclass
    /// defaults apply to missing fields only.
    pub fn present(&self, field: &str) -> bool {
        self.obj.contains_key(field)
    }

    /// The path of the file, for errors.
    pub fn path(&self) -> &'a Path {
        self.path
    }

    /// The value, treating JSON `null` as absent (transformers writes `null` for unset fields).
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    pub fn err(&self, field: &str, detail: impl Into<String>) -> ModelError {
        ModelError::config(self.path, field, detail)
    }

    pub fn usize_opt(&self, field: &str) -> Result<Option<usize>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                self.err(field, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    /// A required positive integer.
    pub fn positive(&self, field: &str) -> Result<usize> {
        match self.usize_opt(field)? {
            None => Err(self.err(field, "missing (required)")),
            Some(0) => Err(self.err(field, "must be positive")),
            Some(n) => Ok(n),
        }
    }

    pub fn positive_or(&self, field: &str, default: usize) -> Result<usize> {
        match self.usize_opt(field)? {
            None => Ok(default),
            Some(0) => Err(self.err(field, "must be positive")),
            Some(n) => Ok(n),
        }
    }

    pub fn f64_or(&self, field: &str, default: f64) -> Result<f64> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    pub fn bool_or(&self, field: &str, default: bool) -> Result<bool> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    pub fn str_opt(&self, field: &str) -> Result<Option<&'a str>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    /// A token id field that may be an integer or a list of integers (`eos_token_id`); `null`
    /// and a missing field are both empty.
    pub fn token_ids(&self, field: &str) -> Result<Vec<u32>> {
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

impl ModelConfig {
    /// Reads `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("config.json"))
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let value = read_json(path)?;
        Self::from_value(&value, path)
    }

    /// Parses an already-read `config.json` with the family it names; `path` is only used in
    /// error messages.
    pub fn from_value(value: &Value, path: &Path) -> Result<Self> {
        let f = Fields::new(value, path)?;
        let (arch, class) = crate::models::detect(&f)?;
        arch.config(&f, &class)
    }

    /// The family the config was read as.
    pub fn family(&self) -> &'static dyn crate::models::Architecture {
        crate::models::by_model_type(self.model_type).expect("configs are made by a family")
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

    /// Parameter count (embeddings counted once when tied). Saturates at `usize::MAX`, which a
    /// parsed config never reaches: the parser refuses sizes whose count overflows.
    pub fn num_parameters(&self) -> usize {
        self.checked_num_parameters().unwrap_or(usize::MAX)
    }

    /// The parameter count, `None` when it (or a width it is made of) overflows `usize`.
    fn checked_num_parameters(&self) -> Option<usize> {
        let sum = |parts: &[usize]| parts.iter().try_fold(0usize, |a, &b| a.checked_add(b));
        let (h, i, v, d) = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.head_dim,
        );
        let q = self.num_attention_heads.checked_mul(d)?;
        let kv = self.num_key_value_heads.checked_mul(d)?;
        let b = &self.block;
        let attn = sum(&[
            h.checked_mul(q)?.checked_mul(2)?,
            h.checked_mul(kv)?.checked_mul(2)?,
            if b.qkv_bias { sum(&[q, kv, kv])? } else { 0 },
            if b.o_bias { h } else { 0 },
            if b.qk_norm { d.checked_mul(2)? } else { 0 },
        ])?;
        let layer = sum(&[attn, h.checked_mul(i)?.checked_mul(3)?, h.checked_mul(2)?])?;
        let embed = v.checked_mul(h)?;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        sum(&[embed, self.num_hidden_layers.checked_mul(layer)?, h, head])
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

/// The defaults of one family's config class where the families differ.
pub(crate) struct FamilyDefaults {
    /// `num_key_value_heads` when the field is missing (`None`: `num_attention_heads`); `null`
    /// always means `num_attention_heads`.
    pub kv_heads: Option<usize>,
    /// `head_dim` when missing or `null` (`None`: `hidden_size / num_attention_heads`).
    pub head_dim: Option<usize>,
    pub max_position_embeddings: usize,
    /// `bos_token_id` / `eos_token_id` when missing (`null` means none).
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: &'static [u32],
    /// Whether the family reads the sliding-window fields.
    pub sliding_window: bool,
}

/// The fields every family reads, with `defaults` where they differ.
pub(crate) fn parse_common(
    f: &Fields,
    architecture: &str,
    model_type: &'static str,
    defaults: &FamilyDefaults,
    block: DecoderBlock,
) -> Result<ModelConfig> {
    let hidden_size = f.positive("hidden_size")?;
    let intermediate_size = f.positive("intermediate_size")?;
    let num_hidden_layers = f.positive("num_hidden_layers")?;
    let num_attention_heads = f.positive("num_attention_heads")?;
    let vocab_size = f.positive("vocab_size")?;
    let kv_default = match (f.present("num_key_value_heads"), defaults.kv_heads) {
        (false, Some(n)) => n,
        _ => num_attention_heads,
    };
    let num_key_value_heads = f.positive_or("num_key_value_heads", kv_default)?;
    if num_attention_heads % num_key_value_heads != 0 {
        let given = if f.get("num_key_value_heads").is_some() {
            String::new()
        } else {
            " (the default for this architecture when the field is missing)".into()
        };
        return Err(f.err(
            "num_key_value_heads",
            format!("{num_key_value_heads}{given} does not divide num_attention_heads {num_attention_heads}"),
        ));
    }
    let head_dim = match (f.usize_opt("head_dim")?, defaults.head_dim) {
        (Some(0), _) => return Err(f.err("head_dim", "must be positive")),
        (Some(d), _) | (None, Some(d)) => d,
        (None, None) => {
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
    let max_position_embeddings =
        f.positive_or("max_position_embeddings", defaults.max_position_embeddings)?;

    if let Some(act) = f.str_opt("hidden_act")? {
        if act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("'{act}' is not supported (only silu)"),
            ));
        }
    }
    let (rope_theta, rope_scaling) = rope(f, max_position_embeddings)?;
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

    let bos_token_id = if f.present("bos_token_id") {
        f.token_ids("bos_token_id")?.first().copied()
    } else {
        defaults.bos_token_id
    };
    let eos_token_ids = if f.present("eos_token_id") {
        f.token_ids("eos_token_id")?
    } else {
        defaults.eos_token_ids.to_vec()
    };
    let sliding_window = if defaults.sliding_window {
        sliding_window(f, num_hidden_layers)?
    } else {
        None
    };

    let config = ModelConfig {
        architecture: architecture.to_string(),
        model_type,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        max_position_embeddings,
        vocab_size,
        rope_theta,
        rope_scaling,
        rms_norm_eps,
        tie_word_embeddings,
        dtype,
        bos_token_id,
        eos_token_ids,
        sliding_window,
        block,
    };
    // Every width and tensor size below the count fits when the count does.
    if config.checked_num_parameters().is_none() {
        return Err(f.err(
            "hidden_size",
            format!(
                "{hidden_size} with intermediate_size {intermediate_size}, num_hidden_layers \
                 {num_hidden_layers}, vocab_size {vocab_size} and {num_attention_heads} heads of \
                 head_dim {head_dim}: the parameter count overflows"
            ),
        ));
    }
    Ok(config)
}

/// `rope_theta` and the frequency scaling (see the module docs).
fn rope(f: &Fields, max_position_embeddings: usize) -> Result<(f64, RopeScaling)> {
    let mut theta = f.f64_or("rope_theta", 10000.0)?;
    let mut scaling = RopeScaling::None;
    // transformers 5 lets a `rope_scaling` dict replace `rope_parameters`.
    let field = ["rope_scaling", "rope_parameters"]
        .into_iter()
        .find(|field| f.get(field).is_some());
    if let Some(field) = field {
        let v = f.get(field).expect("found above");
        let obj = v
            .as_object()
            .ok_or_else(|| f.err(field, format!("expected an object, found {v}")))?;
        let entry = |key: &str| obj.get(key).filter(|v| !v.is_null());
        let number = |key: &str| -> Result<Option<f64>> {
            match entry(key) {
                None => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    f.err(
                        &format!("{field}.{key}"),
                        format!("expected a number, found {v}"),
                    )
                }),
            }
        };
        let required = |key: &str| -> Result<f64> {
            number(key)?.ok_or_else(|| {
                f.err(
                    &format!("{field}.{key}"),
                    "missing (required by rope_type llama3)",
                )
            })
        };
        let kind = entry("rope_type")
            .or_else(|| entry("type"))
            .map(|k| {
                k.as_str().ok_or_else(|| {
                    f.err(
                        &format!("{field}.rope_type"),
                        format!("expected a string, found {k}"),
                    )
                })
            })
            .transpose()?
            .unwrap_or("default");
        match kind {
            "default" => {}
            "llama3" => {
                let original = match number("original_max_position_embeddings")? {
                    None => max_position_embeddings,
                    Some(n) if n >= 1.0 && n.fract() == 0.0 => n as usize,
                    Some(n) => {
                        return Err(f.err(
                            &format!("{field}.original_max_position_embeddings"),
                            format!("expected a positive integer, found {n}"),
                        ))
                    }
                };
                scaling = RopeScaling::Llama3 {
                    factor: required("factor")?,
                    low_freq_factor: required("low_freq_factor")?,
                    high_freq_factor: required("high_freq_factor")?,
                    original_max_position_embeddings: original,
                };
                scaling
                    .validate()
                    .map_err(|e| f.err(field, e.to_string()))?;
            }
            other => {
                return Err(f.err(
                    field,
                    format!("rope type '{other}' is not supported (only default and llama3)"),
                ))
            }
        }
        if let Some(t) = number("rope_theta")? {
            theta = t;
        }
        if let Some(p) = number("partial_rotary_factor")? {
            if p != 1.0 {
                return Err(f.err(
                    &format!("{field}.partial_rotary_factor"),
                    format!("{p}: only a rotary embedding over the whole head is supported"),
                ));
            }
        }
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(f.err("rope_theta", format!("{theta} must be positive and finite")));
    }
    Ok((theta, scaling))
}

/// The sliding window in force, `(window, first sliding layer)`, from the fields Qwen2 and Qwen3
/// share (see the module docs).
pub(crate) fn sliding_window(f: &Fields, layers: usize) -> Result<Option<(usize, usize)>> {
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
                        format!("entry {i} is {t} (expected full_attention or sliding_attention)"),
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
