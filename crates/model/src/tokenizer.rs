//! Tokenizer (`tokenizer.json`, tokenizers crate), chat template (`tokenizer_config.json` or
//! `chat_template.jinja`, rendered with minijinja the way transformers renders it with Jinja2),
//! special token ids, and a streaming detokenizer.

use std::path::Path;

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;
use serde_json::Value as Json;

use crate::config::{GenerationConfig, ModelConfig};
use crate::error::{read_json, ModelError, Result};

/// One message of a conversation (`role` is `system`, `user` or `assistant`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A compiled chat template.
///
/// Rendered like transformers does (`jinja2` with `trim_blocks` and `lstrip_blocks`, a
/// `raise_exception(msg)` function), with Python string/dict methods (`.split`, `.strip`,
/// `.startswith`, `.get`, `.items`, ...) from minijinja-contrib's pycompat layer, `break` /
/// `continue`, and `tojson`.
///
/// A template comes with the model, so rendering is bounded: at most [`ChatTemplate::FUEL`]
/// template instructions (minijinja's fuel; Qwen-style templates spend under 200 per message,
/// so a 30 000-message conversation fits) and [`ChatTemplate::MAX_OUTPUT`] bytes of output,
/// past which rendering is an error rather than a hang or an ever-growing prompt. Not bounded:
/// one expression's own memory (`'x' * 99999999` is 100 MB; minijinja caps a repetition there)
/// and strings a loop doubles through a `namespace`, which fuel alone cannot stop.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

fn template_error(e: minijinja::Error) -> ModelError {
    // minijinja's Display includes the template name and line; keep it on one line.
    let mut msg = e.to_string().replace('\n', " ");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    ModelError::ChatTemplate(msg)
}

/// The rendered prompt, refusing to grow past a limit.
struct LimitedOutput {
    bytes: Vec<u8>,
    limit: usize,
}

impl std::io::Write for LimitedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            return Err(std::io::Error::other("output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Template instructions one render may execute.
    pub const FUEL: u64 = 5_000_000;
    /// Bytes a rendered conversation may have.
    pub const MAX_OUTPUT: usize = 64 << 20;

    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_fuel(Some(Self::FUEL));
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned("chat_template", source.to_string())
            .map_err(template_error)?;
        Ok(Self {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// Renders a conversation; `add_generation_prompt` appends the assistant's turn header.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template("chat_template")
            .map_err(template_error)?;
        let mut out = LimitedOutput {
            bytes: Vec::new(),
            limit: Self::MAX_OUTPUT,
        };
        let rendered = template.render_captured_to(
            minijinja::context! {
                messages => Value::from(minijinja::value::Serde(messages)),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            },
            &mut out,
        );
        match rendered {
            Ok(_) => String::from_utf8(out.bytes)
                .map_err(|e| ModelError::ChatTemplate(format!("output is not UTF-8: {e}"))),
            Err(e) if e.kind() == ErrorKind::WriteFailure => {
                Err(ModelError::ChatTemplate(format!(
                    "the rendered conversation exceeds {} bytes",
                    Self::MAX_OUTPUT
                )))
            }
            Err(e) => Err(template_error(e)),
        }
    }
}

/// Runs a call into the tokenizers crate with its error, or its panic, as a tokenizer error:
/// some malformed `tokenizer.json` files load and then panic when used (a `TemplateProcessing`
/// post-processor naming a special token it does not define, for one).
fn guarded<T>(what: &str, call: impl FnOnce() -> tokenizers::Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(ModelError::Tokenizer(
            format!("{what}: {e}").replace('\n', " "),
        )),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(ModelError::Tokenizer(format!(
                "{what}: the tokenizers library panicked ({detail}); tokenizer.json is malformed"
            )))
        }
    }
}

/// A special token entry of `tokenizer_config.json`: a string or an AddedToken object.
fn token_string(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// The tokenizer of a model, with its chat template and special ids.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("chat_template", &self.template.is_some())
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`, `tokenizer_config.json` (optional) and the chat template of a
    /// model directory. bos/eos ids: `generation_config.json` first (what transformers'
    /// `generate` uses), then `config.json`, then `tokenizer_config.json`'s `eos_token`; every
    /// eos id found is kept, since models list several (Qwen2.5: `<|im_end|>` and
    /// `<|endoftext|>`) and stopping on any of them is what the model expects.
    pub fn from_dir(
        dir: &Path,
        config: &ModelConfig,
        generation: &GenerationConfig,
    ) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::Tokenizer(format!(
                "{}: not found (only fast tokenizers in tokenizer.json are supported)",
                path.display()
            )));
        }
        let inner = guarded(&path.display().to_string(), || {
            tokenizers::Tokenizer::from_file(&path)
        })?;

        let config_path = dir.join("tokenizer_config.json");
        let tok_config = if config_path.is_file() {
            read_json(&config_path)?
        } else {
            Json::Null
        };
        let bos_token = token_string(tok_config.get("bos_token"));
        let eos_token = token_string(tok_config.get("eos_token"));

        let mut eos_token_ids = generation.eos_token_ids.clone();
        for id in &config.eos_token_ids {
            if !eos_token_ids.contains(id) {
                eos_token_ids.push(*id);
            }
        }
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let bos_token_id = generation
            .bos_token_id
            .or(config.bos_token_id)
            .or_else(|| bos_token.as_deref().and_then(|t| inner.token_to_id(t)));

        // transformers 4 keeps the template in tokenizer_config.json (a string, or a list of
        // named templates); transformers 5 writes chat_template.jinja beside it.
        let source = match tok_config.get("chat_template") {
            Some(Json::String(s)) => Some(s.clone()),
            Some(Json::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Json::as_str)
                .map(str::to_string),
            _ => None,
        };
        let jinja_path = dir.join("chat_template.jinja");
        let source = match source {
            Some(s) => Some(s),
            None if jinja_path.is_file() => Some(
                std::fs::read_to_string(&jinja_path).map_err(|e| ModelError::io(&jinja_path, e))?,
            ),
            None => None,
        };
        let template = source
            .map(|s| {
                ChatTemplate::new(
                    &s,
                    bos_token.as_deref().unwrap_or(""),
                    eos_token.as_deref().unwrap_or(""),
                )
            })
            .transpose()?;

        Ok(Self {
            inner,
            template,
            bos_token_id,
            eos_token_ids,
        })
    }

    /// Wraps an in-memory tokenizer (tests, the demo model builder).
    pub fn from_parts(
        inner: tokenizers::Tokenizer,
        template: Option<ChatTemplate>,
        bos_token_id: Option<u32>,
        eos_token_ids: Vec<u32>,
    ) -> Self {
        Self {
            inner,
            template,
            bos_token_id,
            eos_token_ids,
        }
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Number of ids the tokenizer can produce (base vocabulary plus added tokens).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// Encodes text. `add_special_tokens` runs the tokenizer's post-processor (which adds a
    /// BOS for models whose tokenizer says so, e.g. DeepSeek-R1-Distill); use `true` for raw
    /// prompts and `false` for rendered chat templates, which carry their own special tokens,
    /// as transformers does.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = guarded("encode", || self.inner.encode(text, add_special_tokens))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text; ids the vocabulary does not know are skipped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        guarded("decode", || self.inner.decode(ids, skip_special_tokens))
    }

    /// Renders a conversation with the model's chat template.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.template
            .as_ref()
            .ok_or_else(|| {
                ModelError::ChatTemplate(
                    "this model has no chat template (tokenizer_config.json has no chat_template); use a raw prompt".into(),
                )
            })?
            .render(messages, add_generation_prompt)
    }

    /// A streaming detokenizer over this tokenizer (special tokens are not shown).
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, true)
    }
}

/// Turns a stream of token ids into text chunks that are always whole UTF-8 characters.
///
/// Byte-level BPE splits a multi-byte character across tokens, and decoding such a prefix
/// yields U+FFFD. Like text-generation-inference, we decode a small window of recent tokens
/// twice (without and with the new ones) and emit the difference only once the window's text
/// no longer ends in U+FFFD; the window then moves on, so the cost per token stays constant.
/// Decoding a window rather than single tokens also keeps decoders that strip a leading space
/// (SentencePiece-style) correct. [`StreamDecoder::finish`] emits whatever is held back at the
/// end, replacement characters included.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, self.skip_special_tokens)
    }

    /// The text this window adds beyond what was already emitted.
    fn new_text(&self) -> Result<(String, String)> {
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = self.decode(&self.ids[self.prefix_offset..])?;
        Ok((prefix, full))
    }

    fn diff(prefix: &str, full: &str) -> String {
        match full.strip_prefix(prefix) {
            Some(rest) => rest.to_string(),
            // The window's beginning decoded differently once more tokens followed: emit the
            // characters past the length already shown.
            None => full.chars().skip(prefix.chars().count()).collect(),
        }
    }

    /// Adds a token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let (prefix, full) = self.new_text()?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            let out = Self::diff(&prefix, &full);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(Some(out))
        } else {
            Ok(None)
        }
    }

    /// Emits the text still held back (an incomplete character at the very end shows as U+FFFD).
    pub fn finish(&mut self) -> Result<Option<String>> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let (prefix, full) = self.new_text()?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        let out = Self::diff(&prefix, &full);
        Ok((!out.is_empty()).then_some(out))
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
