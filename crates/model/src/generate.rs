//! The generation loop, independent of the CLI: prompt or chat in, text streamed out through
//! a callback, statistics out.
//!
//! The loop talks to the model through [`CausalLm`], so it is tested on the host with a small
//! scripted model and runs unchanged on [`crate::Session`].
//!
//! Each token is chosen where the logits are when the model allows it: greedy generations
//! (temperature 0, no penalty) read back the device's argmax ([`CausalLm::argmax`]), sampled
//! ones the device's draw ([`CausalLm::sample_on_device`], one id per token); a model that
//! offers neither has its logits copied to the host and sampled there ([`Sampler`]), with the
//! same uniform of the seeded stream.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::error::{ModelError, Result};
use crate::sampling::{argmax, Sampler, SamplingParams};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// A causal language model with a KV cache: what the generation loop needs.
pub trait CausalLm {
    /// Width of the logits.
    fn vocab_size(&self) -> usize;
    /// Positions the cache holds.
    fn max_len(&self) -> usize;
    /// Positions filled so far.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Empties the cache.
    fn reset(&mut self) -> Result<()>;
    /// Keeps the first `len` positions of the cache and forgets the rest, so that a prompt that
    /// starts with the tokens already there is prefilled only from `len` on. Returns false when
    /// the model cannot (the caller then resets); the default.
    fn truncate(&mut self, len: usize) -> Result<bool> {
        let _ = len;
        Ok(false)
    }
    /// Runs `tokens` through the model in one pass after what the cache holds; the logits of
    /// the last position become current.
    fn prefill(&mut self, tokens: &[u32]) -> Result<()>;
    /// Runs one token; its logits become current.
    fn decode(&mut self, token: u32) -> Result<()>;
    /// Greedy decoding one step ahead of the host, after a [`Self::decode`]: runs the next
    /// step on the current argmax as the device holds it (the host has not seen it yet) and
    /// returns that token, read back while the step runs; its logits become current. The
    /// device then never waits for the host between steps. `Ok(None)` (the default) when the
    /// model cannot, or the cache has no room for the step: the caller then reads the argmax
    /// ([`Self::argmax`]) and decodes it. A caller that does not want the step (the token ended
    /// the generation) truncates it away ([`Self::truncate`] to `len() - 1`).
    fn decode_argmax_ahead(&mut self) -> Result<Option<u32>> {
        Ok(None)
    }
    /// [`Self::decode_argmax_ahead`] for sampled decoding: draws the next token from the
    /// current logits with `params`, the penalty's `context` and the uniform `u`
    /// ([`Self::sample_on_device`]'s draw) on the device, runs the next step on it there, and
    /// returns it, read back while the step runs. `Ok(None)` (the default) when the model
    /// cannot (then nothing was drawn).
    fn decode_sample_ahead(
        &mut self,
        params: &SamplingParams,
        context: &[u32],
        u: f64,
    ) -> Result<Option<u32>> {
        let _ = (params, context, u);
        Ok(None)
    }
    /// Copies the current logits (f32, `vocab_size` values) into `out`.
    fn logits(&mut self, out: &mut Vec<f32>) -> Result<()>;
    /// The argmax of the current logits (first on ties). Models override this to compute it on
    /// the device and read back one id instead of the whole vocabulary.
    fn argmax(&mut self) -> Result<u32> {
        let mut buf = Vec::new();
        self.logits(&mut buf)?;
        argmax(&buf).ok_or(ModelError::BadLogits {
            step: self.len(),
            detail: "no finite value".into(),
        })
    }
    /// Samples the next token from the current logits where they are, with `params` (the
    /// seed aside), the repetition penalty's `context` (every token the model has seen, prompt
    /// and chosen) and the draw's uniform `u` in `[0, 1)`, reading back one id. `Ok(None)` (the
    /// default) when the model cannot: the caller then copies the logits and samples on the
    /// host with the same `u` ([`Sampler::sample_with`]), which chooses the same token up to
    /// rounding.
    fn sample_on_device(
        &mut self,
        params: &SamplingParams,
        context: &[u32],
        u: f64,
    ) -> Result<Option<u32>> {
        let _ = (params, context, u);
        Ok(None)
    }
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text, tokenized as it is (the tokenizer's post-processor may add a BOS).
    Text(String),
    /// A conversation rendered with the model's chat template (with the assistant header).
    Chat(Vec<ChatMessage>),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// Options of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation stops when the text contains one of these; the text up to it is kept and the
    /// stop string itself is not emitted.
    pub stop_strings: Vec<String>,
    /// Ids that end generation (not emitted as text). `None`: the tokenizer's eos ids.
    pub eos_token_ids: Option<Vec<u32>>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            eos_token_ids: None,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-sequence id.
    Eos(u32),
    /// The text reached a stop string.
    StopString(String),
    /// `max_new_tokens` were generated.
    MaxNewTokens,
    /// The KV cache is full (the context holds `max_len` positions).
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
}

/// Timings and counts of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    /// Leading prompt tokens whose keys and values were kept from the previous generation
    /// ([`Generator::set_prefix_reuse`]) instead of being computed again.
    pub cached_prompt_tokens: usize,
    /// Tokens chosen (an eos that ended generation included).
    pub generated_tokens: usize,
    /// The prompt's forward pass up to the first token's logits.
    pub prefill_time: Duration,
    /// From the start of prefill until the first token was chosen.
    pub time_to_first_token: Duration,
    /// From the first token to the last (the decode steps and their sampling).
    pub decode_time: Duration,
    /// Of `decode_time`, the host's time in [`CausalLm::decode`]: writing a step's inputs and
    /// launching it (the device works asynchronously).
    pub decode_launch_time: Duration,
    /// Of `decode_time`, the time spent choosing each next token: waiting for the step to finish
    /// and reading back its choice (or sampling on the host); one step ahead
    /// ([`CausalLm::decode_argmax_ahead`], [`CausalLm::decode_sample_ahead`]), also launching
    /// the step after it. The rest of
    /// `decode_time` is the host's own per-token work (detokenizer, stop conditions, the text
    /// callback).
    pub decode_choose_time: Duration,
    pub stop_reason: StopReason,
}

impl GenerationStats {
    /// Prompt tokens computed (the cached ones excluded) per second of prefill.
    pub fn prefill_tokens_per_sec(&self) -> f64 {
        (self.prompt_tokens - self.cached_prompt_tokens) as f64
            / self.prefill_time.as_secs_f64().max(1e-12)
    }

    /// Decode steps per second (the first token comes from prefill and is not counted).
    pub fn decode_tokens_per_sec(&self) -> f64 {
        let steps = self.generated_tokens.saturating_sub(1);
        if steps == 0 {
            return 0.0;
        }
        steps as f64 / self.decode_time.as_secs_f64().max(1e-12)
    }

    /// One line for humans (the CLI prints it to stderr).
    pub fn summary(&self) -> String {
        format!(
            "prompt {} tokens{}, prefill {:.1} tok/s, decode {:.1} tok/s ({} tokens), time to first token {:.1} ms, stop: {}",
            self.prompt_tokens,
            if self.cached_prompt_tokens > 0 {
                format!(" ({} cached)", self.cached_prompt_tokens)
            } else {
                String::new()
            },
            self.prefill_tokens_per_sec(),
            self.decode_tokens_per_sec(),
            self.generated_tokens,
            self.time_to_first_token.as_secs_f64() * 1e3,
            match &self.stop_reason {
                StopReason::Eos(id) => format!("eos ({id})"),
                StopReason::StopString(s) => format!("stop string {s:?}"),
                StopReason::MaxNewTokens => "max new tokens".into(),
                StopReason::ContextFull => "context full".into(),
                StopReason::Cancelled => "cancelled".into(),
            }
        )
    }
}

/// The result of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOutput {
    /// The generated text (stop string and eos excluded), exactly what was streamed.
    pub text: String,
    /// The generated ids (an eos that ended generation included, as transformers does).
    pub tokens: Vec<u32>,
    pub prompt_tokens: Vec<u32>,
    pub stats: GenerationStats,
}

/// Holds back streamed text that might be the beginning of a stop string.
struct StopFilter {
    stops: Vec<String>,
    /// All text so far (emitted and pending).
    text: String,
    emitted: usize,
}

impl StopFilter {
    fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            text: String::new(),
            emitted: 0,
        }
    }

    /// Appends text; returns what can be emitted and the stop string found, if any.
    fn push(&mut self, chunk: &str, at_end: bool) -> (String, Option<String>) {
        self.text.push_str(chunk);
        let pending = &self.text[self.emitted..];
        // Earliest stop string in the not-yet-emitted text (a match cannot start inside
        // emitted text: a suffix that could begin one was always held back).
        let found = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| pending.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|(p, _)| *p);
        if let Some((p, s)) = found {
            let end = self.emitted + p;
            let out = self.text[self.emitted..end].to_string();
            self.text.truncate(end);
            self.emitted = end;
            return (out, Some(s.clone()));
        }
        let hold = if at_end {
            0
        } else {
            // Longest suffix of the pending text that is a proper prefix of a stop string.
            let mut hold = 0;
            for s in &self.stops {
                for (i, _) in s.char_indices().skip(1) {
                    if i > hold && pending.ends_with(&s[..i]) {
                        hold = i;
                    }
                }
            }
            hold
        };
        let end = self.text.len() - hold;
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        (out, None)
    }
}

/// Generation over a model and its tokenizer.
pub struct Generator<M: CausalLm> {
    model: M,
    tokenizer: Tokenizer,
    prefix_reuse: bool,
    /// The tokens whose keys and values the model's cache holds, in order, when this generator
    /// put them there (emptied when that is not known).
    cached: Vec<u32>,
}

/// Length of the common prefix of two token sequences.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<M: CausalLm> Generator<M> {
    pub fn new(model: M, tokenizer: Tokenizer) -> Self {
        Self {
            model,
            tokenizer,
            prefix_reuse: false,
            cached: Vec::new(),
        }
    }

    /// Keeps the KV cache between generations: a prompt that starts with the tokens of the
    /// previous one (and of its answer, as a chat's next turn does) is prefilled only from
    /// where they differ. Off by default (every generation starts from an empty cache, which is
    /// what a benchmark of prefill wants); the output is the same either way, up to the
    /// rounding of a prefill split in two.
    pub fn set_prefix_reuse(&mut self, on: bool) {
        self.prefix_reuse = on;
        if !on {
            self.cached.clear();
        }
    }

    /// Forgets the cached prefix: the next generation starts from an empty cache.
    pub fn forget_prefix(&mut self) {
        self.cached.clear();
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    /// The model, for calls outside the generator (which then no longer trusts its cache).
    pub fn model_mut(&mut self) -> &mut M {
        self.cached.clear();
        &mut self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn into_parts(self) -> (M, Tokenizer) {
        (self.model, self.tokenizer)
    }

    /// The prompt's token ids.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Text(text) => self.tokenizer.encode(text, true),
            Prompt::Chat(messages) => {
                let rendered = self.tokenizer.apply_chat_template(messages, true)?;
                self.tokenizer.encode(&rendered, false)
            }
            Prompt::Tokens(ids) => Ok(ids.clone()),
        }
    }

    /// Generates a continuation, calling `on_text` with each piece of text as soon as it is
    /// complete (whole characters, never part of a stop string). Returning
    /// `ControlFlow::Break(())` from the callback stops generation.
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        mut on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenerateOutput> {
        let prompt_tokens = self.prompt_tokens(prompt)?;
        if prompt_tokens.is_empty() {
            return Err(ModelError::param(
                "prompt",
                "is empty (no tokens to start from)",
            ));
        }
        let vocab = self.model.vocab_size();
        if let Some(&bad) = prompt_tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::param(
                "prompt",
                format!("token id {bad} is outside the model's vocabulary of {vocab}"),
            ));
        }
        let max_len = self.model.max_len();
        if prompt_tokens.len() > max_len {
            return Err(ModelError::ContextOverflow {
                needed: prompt_tokens.len(),
                max_len,
            });
        }
        let mut seq = Sequence::with_context(&self.tokenizer, prompt_tokens, options, max_len)?;
        if options.max_new_tokens == 0 {
            return seq.finish(StopReason::MaxNewTokens, &mut on_text);
        }
        let prompt_tokens = seq.prompt_tokens().to_vec();

        let mut logits = Vec::new();

        // Reuse the cached prefix, leaving at least one prompt token to compute (its logits
        // choose the first token).
        let cached = std::mem::take(&mut self.cached);
        let keep = if self.prefix_reuse && self.model.len() == cached.len() {
            common_prefix(&cached, &prompt_tokens).min(prompt_tokens.len() - 1)
        } else {
            0
        };
        let kept = keep > 0 && self.model.truncate(keep)?;
        if !kept {
            self.model.reset()?;
        }
        seq.stats.cached_prompt_tokens = if kept { keep } else { 0 };
        self.model
            .prefill(&prompt_tokens[seq.stats.cached_prompt_tokens..])?;
        // Launches are asynchronous: the prefill is done when its first token is read back, so
        // both figures are taken there.
        let mut token = seq.choose(&mut self.model, &mut logits)?;
        seq.first_token_chosen();

        let reason = 'generation: loop {
            if let Some(reason) = seq.push(token, self.model.len(), &mut on_text)? {
                break reason;
            }
            let launch = Instant::now();
            self.model.decode(token)?;
            seq.stats.decode_launch_time += launch.elapsed();
            // Each next step is launched on the device's choice before the host reads that
            // choice back, so the device never waits for the host between steps.
            loop {
                // A token that ends the generation by its budget is read without a step
                // launched on it (a step no one wants would delay the next generation).
                if seq.stats.generated_tokens + 1 >= seq.max_new_tokens {
                    break;
                }
                let ahead = Instant::now();
                let chosen = if seq.greedy {
                    self.model.decode_argmax_ahead()?
                } else {
                    // The draw's uniform is taken back when the model cannot sample ahead, so
                    // the seeded stream is the same either way.
                    let before = seq.sampler.clone();
                    let u = seq.sampler.next_uniform();
                    let params = *seq.sampler.params();
                    let chosen = self.model.decode_sample_ahead(&params, &seq.context, u)?;
                    if chosen.is_none() {
                        seq.sampler = before;
                    }
                    chosen
                };
                let Some(chosen) = chosen else {
                    break;
                };
                seq.stats.decode_choose_time += ahead.elapsed();
                // The model already holds the step on `chosen`.
                let held = self.model.len() - 1;
                if let Some(reason) = seq.push(chosen, held, &mut on_text)? {
                    // The step that ran on the last token is not wanted.
                    if !self.model.truncate(held)? {
                        self.model.reset()?;
                    }
                    break 'generation reason;
                }
            }
            let choose = Instant::now();
            token = seq.choose(&mut self.model, &mut logits)?;
            seq.stats.decode_choose_time += choose.elapsed();
        };
        let output = seq.finish(reason, &mut on_text)?;
        if self.prefix_reuse {
            // Every token chosen went through the model except the last one.
            let decoded = output.tokens.len().saturating_sub(1);
            let mut held = output.prompt_tokens.clone();
            held.extend_from_slice(&output.tokens[..decoded]);
            if held.len() == self.model.len() {
                self.cached = held;
            }
        }
        Ok(output)
    }
}

/// One generation in progress, from its prompt to its last token: the sampler and its context,
/// the stop conditions, the streaming detokenizer and stop-string filter, and the statistics.
/// [`Generator::generate`] drives one over a [`CausalLm`]; a batching scheduler drives several,
/// one per sequence of a batched decode step, and each sequence's text and statistics come out
/// the same as from a generation of its own.
pub struct Sequence<'t> {
    sampler: Sampler,
    greedy: bool,
    /// Prompt and chosen tokens (the repetition penalty's context).
    context: Vec<u32>,
    prompt_len: usize,
    eos: Vec<u32>,
    max_new_tokens: usize,
    max_len: usize,
    detok: crate::tokenizer::StreamDecoder<'t>,
    stop: StopFilter,
    text: String,
    tokens: Vec<u32>,
    /// Counts and timings (public for the prefix reuse's `cached_prompt_tokens`).
    pub stats: GenerationStats,
    started: Instant,
    first_at: Option<Instant>,
}

impl<'t> Sequence<'t> {
    /// A generation of `prompt_tokens` (checked by the caller against the vocabulary and the
    /// context) with `options`; its prefill starts now (the time to first token counts from
    /// here).
    pub fn new(
        tokenizer: &'t Tokenizer,
        prompt_tokens: Vec<u32>,
        options: &GenerateOptions,
    ) -> Result<Self> {
        Self::with_context(tokenizer, prompt_tokens, options, usize::MAX)
    }

    /// [`Self::new`] for a model whose context holds `max_len` positions: [`Self::push`] ends
    /// the generation with [`StopReason::ContextFull`] there.
    pub fn with_context(
        tokenizer: &'t Tokenizer,
        prompt_tokens: Vec<u32>,
        options: &GenerateOptions,
        max_len: usize,
    ) -> Result<Self> {
        let sampler = Sampler::new(options.sampling)?;
        let eos = options
            .eos_token_ids
            .clone()
            .unwrap_or_else(|| tokenizer.eos_token_ids().to_vec());
        Ok(Self {
            sampler,
            greedy: options.sampling.is_plain_greedy(),
            prompt_len: prompt_tokens.len(),
            context: prompt_tokens,
            eos,
            max_new_tokens: options.max_new_tokens,
            max_len,
            detok: tokenizer.stream(),
            stop: StopFilter::new(options.stop_strings.clone()),
            text: String::new(),
            tokens: Vec::new(),
            stats: GenerationStats {
                prompt_tokens: 0,
                cached_prompt_tokens: 0,
                generated_tokens: 0,
                prefill_time: Duration::ZERO,
                time_to_first_token: Duration::ZERO,
                decode_time: Duration::ZERO,
                decode_launch_time: Duration::ZERO,
                decode_choose_time: Duration::ZERO,
                stop_reason: StopReason::MaxNewTokens,
            },
            started: Instant::now(),
            first_at: None,
        })
    }

    pub fn prompt_tokens(&self) -> &[u32] {
        &self.context[..self.prompt_len]
    }

    /// Whether the next token is the plain argmax of the logits (which a model computes on the
    /// device and reads back as one id; the other choices go through [`Self::choose`], on the
    /// device where the model samples there, or [`Self::sample`] on the host).
    pub fn greedy_on_device(&self) -> bool {
        self.greedy
    }

    /// Chooses the next token from `logits` (f32, the vocabulary wide; modified in place) with
    /// the sampling options and the context so far, on the host.
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32> {
        self.sampler.sample(logits, &self.context)
    }

    /// Chooses the next token from `model`'s current logits: its device argmax for plain greedy
    /// generations, its device draw for the others where it has one
    /// ([`CausalLm::sample_on_device`]), else the host sampler on its logits (read into
    /// `logits`, a scratch buffer). Either way the draw takes the next uniform of the seeded
    /// stream, so the tokens do not depend on where they were drawn (up to rounding).
    pub fn choose<M: CausalLm>(&mut self, model: &mut M, logits: &mut Vec<f32>) -> Result<u32> {
        if self.greedy {
            return model.argmax();
        }
        let u = self.sampler.next_uniform();
        let params = *self.sampler.params();
        if let Some(token) = model.sample_on_device(&params, &self.context, u)? {
            return Ok(token);
        }
        model.logits(logits)?;
        self.sampler.sample_with(logits, &self.context, u)
    }

    /// Records that the first token was chosen (the prefill's logits were read back): the time
    /// to first token.
    pub fn first_token_chosen(&mut self) {
        self.stats.time_to_first_token = self.started.elapsed();
        self.stats.prefill_time = self.stats.time_to_first_token;
        self.first_at = Some(Instant::now());
    }

    /// Takes the token just chosen, with the model holding `model_len` positions: streams its
    /// text through `on_text`, and returns why generation ends if it does (the token is then
    /// not to be decoded), `None` when the model should decode it next.
    pub fn push(
        &mut self,
        token: u32,
        model_len: usize,
        on_text: &mut impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Option<StopReason>> {
        if self.first_at.is_none() {
            self.first_token_chosen();
        }
        self.stats.generated_tokens += 1;
        self.tokens.push(token);
        self.context.push(token);
        if self.eos.contains(&token) {
            return Ok(Some(StopReason::Eos(token)));
        }
        if let Some(piece) = self.detok.push(token)? {
            let (out, found) = self.stop.push(&piece, false);
            if !out.is_empty() {
                self.text.push_str(&out);
                if on_text(&out).is_break() {
                    return Ok(Some(StopReason::Cancelled));
                }
            }
            if let Some(s) = found {
                return Ok(Some(StopReason::StopString(s)));
            }
        }
        if self.stats.generated_tokens >= self.max_new_tokens {
            return Ok(Some(StopReason::MaxNewTokens));
        }
        if model_len >= self.max_len {
            return Ok(Some(StopReason::ContextFull));
        }
        Ok(None)
    }

    /// Ends the generation for `reason`: flushes what the detokenizer and the stop filter still
    /// hold (not after a stop string: everything past it is dropped; not after a cancel: the
    /// caller wants no more) and returns the output.
    pub fn finish(
        mut self,
        reason: StopReason,
        on_text: &mut impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenerateOutput> {
        if let Some(first_at) = self.first_at {
            self.stats.decode_time = first_at.elapsed();
        }
        let mut final_reason = reason;
        if !self.tokens.is_empty()
            && !matches!(
                final_reason,
                StopReason::StopString(_) | StopReason::Cancelled
            )
        {
            let tail = self.detok.finish()?.unwrap_or_default();
            let (out, found) = self.stop.push(&tail, true);
            if !out.is_empty() {
                self.text.push_str(&out);
                let _ = on_text(&out);
            }
            if let Some(s) = found {
                final_reason = StopReason::StopString(s);
            }
        }
        self.stats.prompt_tokens = self.prompt_len;
        self.stats.stop_reason = final_reason;
        let prompt_tokens = self.context[..self.prompt_len].to_vec();
        Ok(GenerateOutput {
            text: self.text,
            tokens: self.tokens,
            prompt_tokens,
            stats: self.stats,
        })
    }
}
