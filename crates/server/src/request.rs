//! Reading an OpenAI request body into a prompt and generation options, with a 400 naming the
//! parameter for anything this server cannot honour (never a silently ignored setting that
//! changes the answer).
//!
//! Supported: `model`, `messages` / `prompt`, `max_tokens` (`max_completion_tokens`),
//! `temperature`, `top_p`, `stop`, `seed`, `stream`, `stream_options.include_usage`, `n = 1`,
//! and the extensions `top_k`, `repetition_penalty` and `ignore_eos` (as vLLM names them).
//! Sampling parameters left out take the model's `generation_config.json`, else greedy.
//! Unknown fields are ignored, as OpenAI's own clients send fields a server may not know.

use std::sync::atomic::{AtomicU64, Ordering};

use model::sampling::{self, SamplingOverrides};
use model::{ChatMessage, GenerateOptions, ModelError};
use serde_json::{Map, Value};

use crate::engine::Engine;
use crate::error::ApiError;

/// Most stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 16;

/// A checked request.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub stream: bool,
    pub include_usage: bool,
}

/// Which endpoint the body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// Parses and checks a body for `endpoint`.
pub fn parse(engine: &Engine, endpoint: Endpoint, body: &[u8]) -> Result<Request, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("The request body is not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::invalid("The request body must be a JSON object"));
    };
    let fields = Fields(&obj);
    if let Some(name) = fields.string("model")? {
        if name != engine.model_id() {
            return Err(ApiError::unknown_model(name, engine.model_id()));
        }
    }
    refuse_unsupported(&fields)?;

    let prompt = match endpoint {
        Endpoint::Chat => chat_prompt(engine, &fields)?,
        Endpoint::Completion => completion_prompt(engine, &fields)?,
    };
    if prompt.is_empty() {
        return Err(ApiError::param(
            endpoint.prompt_param(),
            "The prompt is empty (no tokens to start from)",
        ));
    }
    let vocab = engine.tokenizer().vocab_size();
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::param(
            endpoint.prompt_param(),
            format!("Token id {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    let max_len = engine.max_len();
    if prompt.len() > max_len {
        let mut e = ApiError::context_length(prompt.len(), max_len);
        e.param = Some(endpoint.prompt_param().to_string());
        return Err(e);
    }

    // Room left after the prompt (the first token comes from the prompt's pass, so a prompt
    // that fills the context still gets one).
    let room = (max_len - prompt.len()).max(1);
    let max_tokens = match (
        fields.uint("max_completion_tokens")?,
        fields.uint("max_tokens")?,
    ) {
        (Some(n), _) | (None, Some(n)) => {
            if n == 0 {
                return Err(ApiError::param(
                    "max_tokens",
                    "max_tokens must be at least 1",
                ));
            }
            (n as usize).min(room)
        }
        (None, None) => room,
    };

    let asked = SamplingOverrides {
        temperature: fields.number("temperature")?.map(|v| v as f32),
        top_k: match fields.int("top_k")? {
            // -1 disables top-k, as in vLLM.
            Some(-1) => Some(0),
            Some(k) if k < 0 => {
                return Err(ApiError::param(
                    "top_k",
                    "top_k must be >= 0 (or -1 for none)",
                ))
            }
            Some(k) => Some(k as usize),
            None => None,
        },
        top_p: fields.number("top_p")?.map(|v| v as f32),
        repetition_penalty: fields.number("repetition_penalty")?.map(|v| v as f32),
    };
    let seed = match fields.int("seed")? {
        Some(s) => s as u64,
        None => fresh_seed(),
    };
    let params = sampling::resolve(&asked, engine.generation_config(), seed);
    params.validate().map_err(|e| match e {
        ModelError::InvalidParameter { name, detail } => {
            ApiError::param(name, format!("Invalid {name}: {detail}"))
        }
        other => ApiError::invalid(other.to_string()),
    })?;

    let stop_strings = match fields.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::param("stop", "stop must be a string or an array of strings")
            })?,
        Some(_) => {
            return Err(ApiError::param(
                "stop",
                "stop must be a string or an array of strings",
            ))
        }
    };
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::param(
            "stop",
            format!("At most {MAX_STOP_STRINGS} stop strings are supported"),
        ));
    }
    if stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::param("stop", "Stop strings must not be empty"));
    }
    let ignore_eos = fields.bool("ignore_eos")?.unwrap_or(false);

    let stream = fields.bool("stream")?.unwrap_or(false);
    let include_usage = match fields.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => Fields(o).bool("include_usage")?.unwrap_or(false),
        Some(_) => {
            return Err(ApiError::param(
                "stream_options",
                "stream_options must be an object",
            ))
        }
    };
    Ok(Request {
        prompt,
        options: GenerateOptions {
            max_new_tokens: max_tokens,
            sampling: params,
            stop_strings,
            eos_token_ids: ignore_eos.then(Vec::new),
        },
        stream,
        include_usage,
    })
}

impl Endpoint {
    fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completion => "prompt",
        }
    }
}

/// Settings that would change the answer and that this server does not implement.
fn refuse_unsupported(fields: &Fields) -> Result<(), ApiError> {
    if let Some(n) = fields.uint("n")? {
        if n != 1 {
            return Err(ApiError::param("n", "Only n = 1 is supported"));
        }
    }
    if let Some(b) = fields.uint("best_of")? {
        if b != 1 {
            return Err(ApiError::param("best_of", "Only best_of = 1 is supported"));
        }
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        if fields.number(name)?.is_some_and(|v| v != 0.0) {
            return Err(ApiError::param(
                name,
                format!("{name} is not supported (use repetition_penalty)"),
            ));
        }
    }
    match fields.get("logprobs") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(_) => return Err(ApiError::param("logprobs", "logprobs are not supported")),
    }
    if fields.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::param("echo", "echo is not supported"));
    }
    for name in ["tools", "functions"] {
        if let Some(Value::Array(a)) = fields.get(name) {
            if !a.is_empty() {
                return Err(ApiError::param(name, format!("{name} are not supported")));
            }
        }
    }
    if let Some(Value::Object(f)) = fields.get("response_format") {
        if f.get("type").and_then(Value::as_str).unwrap_or("text") != "text" {
            return Err(ApiError::param(
                "response_format",
                "Only the text response format is supported",
            ));
        }
    }
    Ok(())
}

fn chat_prompt(engine: &Engine, fields: &Fields) -> Result<Vec<u32>, ApiError> {
    let Some(template) = engine.tokenizer().chat_template() else {
        return Err(ApiError::invalid(
            "This model has no chat template; use /v1/completions",
        ));
    };
    let messages = match fields.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => {
            return Err(ApiError::param("messages", "messages must not be empty"))
        }
        Some(_) => return Err(ApiError::param("messages", "messages must be an array")),
        None => {
            return Err(ApiError::param(
                "messages",
                "Missing required parameter: messages",
            ))
        }
    };
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| chat_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let rendered = template
        .render(&messages, true)
        .map_err(|e| ApiError::param("messages", e.to_string()))?;
    engine
        .tokenizer()
        .encode(&rendered, false)
        .map_err(|e| ApiError::param("messages", e.to_string()))
}

fn chat_message(i: usize, m: &Value) -> Result<ChatMessage, ApiError> {
    let param = format!("messages[{i}]");
    let Value::Object(m) = m else {
        return Err(ApiError::param(&param, "Each message must be an object"));
    };
    let role = match m.get("role").and_then(Value::as_str) {
        Some("developer") => "system",
        Some(r @ ("system" | "user" | "assistant")) => r,
        Some(other) => {
            return Err(ApiError::param(
                &format!("{param}.role"),
                format!("Unsupported role '{other}' (system, developer, user or assistant)"),
            ))
        }
        None => {
            return Err(ApiError::param(
                &format!("{param}.role"),
                "Each message needs a string role",
            ))
        }
    };
    let content = match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) if role == "assistant" => String::new(),
        // Content parts: only text parts carry meaning here.
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::param(
                            &format!("{param}.content"),
                            "Only text content parts are supported",
                        ))
                    }
                }
            }
            text
        }
        _ => {
            return Err(ApiError::param(
                &format!("{param}.content"),
                "content must be a string or an array of text parts",
            ))
        }
    };
    Ok(ChatMessage::new(role, content))
}

fn completion_prompt(engine: &Engine, fields: &Fields) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::param(
            "prompt",
            "prompt must be a string, an array of one string, or an array of token ids",
        )
    };
    let text = match fields.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            items[0].as_str().unwrap_or_default().to_string()
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            return items
                .iter()
                .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(bad);
        }
        Some(Value::Array(items)) if items.len() > 1 => {
            return Err(ApiError::param(
                "prompt",
                "Only one prompt per request is supported",
            ))
        }
        None => {
            return Err(ApiError::param(
                "prompt",
                "Missing required parameter: prompt",
            ))
        }
        Some(_) => return Err(bad()),
    };
    engine
        .tokenizer()
        .encode(&text, true)
        .map_err(|e| ApiError::param("prompt", e.to_string()))
}

/// A seed for a request that gives none: different for every request.
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Typed access to a body's fields, with errors that name the field.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    /// The value, with JSON `null` read as absent.
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn string(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::param(name, format!("{name} must be a string"))),
        }
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::param(
                name,
                format!("{name} must be true or false"),
            )),
        }
    }

    fn number(&self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(_) => Err(ApiError::param(name, format!("{name} must be a number"))),
        }
    }

    fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_u64().map(|u| u as i64))
                .map(Some)
                .ok_or_else(|| ApiError::param(name, format!("{name} must be an integer"))),
            Some(_) => Err(ApiError::param(name, format!("{name} must be an integer"))),
        }
    }

    fn uint(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
            Some(_) => Err(ApiError::param(
                name,
                format!("{name} must be a non-negative integer"),
            )),
        }
    }
}
