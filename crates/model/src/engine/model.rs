//! A loaded model of any family: its weights, and the forward pass that prefill and the decode
//! step share ([`Model::prefill`], [`Model::decode_step`]):
//!
//! ```text
//! x = embedding(embed_tokens, ids)                                 [T, H]
//! per layer: the family's decoder block (crate::models::decoder)
//! x = rms_norm(x, norm); logits = linear(x, lm_head or embed_tokens when tied)
//! ```
//!
//! Prefill runs `T` tokens over activations allocated for the call, with the cache length known
//! on the host. The decode step runs one token over the preallocated [`DecodeBuffers`], with the
//! token id read from `DecodeBuffers::token` and its position and the cache length read from
//! the cache's device copies ([`KvCache::begin_append`]), so the whole step can be captured
//! once as a CUDA graph and replayed. Between replays the host writes at most the token id: the
//! step's last kernel advances those scalars to the next step's values itself.

use std::path::{Path, PathBuf};

use cubecl::prelude::*;
use ops::linear::LinearWorkspace;
use ops::matmul::linear_opts_into;
use ops::qkv::HeadShape;
use ops::rope::RopeCache;
use ops::{DType, DeviceTensor};

use crate::config::{GenerationConfig, ModelConfig};
use crate::engine::batch::{BatchBuffers, SlotCache};
use crate::engine::buffers::{Activations, CacheLen, DecodeBuffers, StepContext};
use crate::engine::kv_cache::{KvCache, LayerCache};
use crate::engine::projection::{Projection, ProjectionScratch, Weight};
use crate::engine::screen::{HeadScreen, ScreenBuffers};
use crate::error::{ModelError, Result};
use crate::models::decoder::DecoderLayer;

/// Which logits [`Model::prefill`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// The last position's (what generation needs).
    Last,
    /// Every position's (what the comparison with transformers needs).
    All,
}

/// A loaded model.
pub struct Model<R: Runtime> {
    client: ComputeClient<R>,
    config: ModelConfig,
    generation: GenerationConfig,
    dir: PathBuf,
    dtype: DType,
    max_len: usize,
    pub embed_tokens: Weight<R>,
    pub layers: Vec<DecoderLayer<R>>,
    pub norm: Weight<R>,
    /// `None` when the embeddings are tied (the logits use `embed_tokens`), unless the head is
    /// compressed: then its own compressed copy.
    pub lm_head: Option<Projection<R>>,
    /// RoPE cos/sin for every position below `max_len`.
    pub rope: RopeCache<R>,
    /// The int8 screen of the float LM head ([`crate::LoadOptions::screen_lm_head`]).
    screen: Option<HeadScreen<R>>,
}

impl<R: Runtime> std::fmt::Debug for Model<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Model {{ {}, dir: {}, layers: {}, dtype: {}, max_len: {} }}",
            self.config.architecture,
            self.dir.display(),
            self.layers.len(),
            self.dtype,
            self.max_len
        )
    }
}

/// Where a one-sequence decode step's input row comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StepInput {
    /// The embedding of the id in [`DecodeBuffers::token`] (written by the host, or drawn by
    /// the device sampler), gathered by the step's first kernel.
    Token,
    /// The row the previous step's argmax gathered into the step's activation when it chose
    /// its id (the id also in [`DecodeBuffers::next_token`]): valid only right after a
    /// decode step, before anything else writes that activation.
    Chosen,
}

/// What a one-sequence decode step's argmax advances and writes besides the id: the cache's
/// device position and length, the id's slot of the length's parity, and the id's embedding
/// row (the activation a [`StepInput::Chosen`] step starts from).
struct OneSequence<'a, R: Runtime> {
    cache: &'a KvCache<R>,
    slots: &'a [DeviceTensor<R>; 2],
    hidden: &'a DeviceTensor<R>,
}

/// What the head of the forward pass reads and writes.
struct Head<'a, R: Runtime> {
    /// Gather this row of the residual stream into `row` first (prefill's last position).
    last_row: Option<(&'a DeviceTensor<R>, &'a DeviceTensor<R>)>,
    normed: &'a DeviceTensor<R>,
    /// `None`: the forward pass ends with the final norm (the screened head follows).
    logits: Option<&'a DeviceTensor<R>>,
}

impl<R: Runtime> Model<R> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        client: &ComputeClient<R>,
        config: ModelConfig,
        generation: GenerationConfig,
        dir: &Path,
        dtype: DType,
        max_len: usize,
        embed_tokens: Weight<R>,
        layers: Vec<DecoderLayer<R>>,
        norm: Weight<R>,
        lm_head: Option<Projection<R>>,
        rope: RopeCache<R>,
    ) -> Self {
        Self {
            client: client.clone(),
            config,
            generation,
            dir: dir.to_path_buf(),
            dtype,
            max_len,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            screen: None,
        }
    }

    /// Builds the int8 screen of the float LM head (the embedding table when tied).
    pub(crate) fn build_screen(&mut self) -> Result<()> {
        let head = self.float_head().ok_or_else(|| {
            ModelError::param(
                "screen_lm_head",
                "the LM head is compressed: screening needs a float LM head",
            )
        })?;
        self.screen = Some(HeadScreen::build(&self.client, head)?);
        Ok(())
    }

    /// Whether greedy decode steps on the previous step's argmax screen the LM head
    /// ([`crate::LoadOptions::screen_lm_head`]).
    pub fn screens_lm_head(&self) -> bool {
        self.screen.is_some()
    }

    /// Device bytes of every weight (compressed projections as stored).
    pub fn weight_bytes(&self) -> u64 {
        let dense: usize = self
            .weights()
            .iter()
            .map(|w| w.tensor.numel() * w.tensor.dtype().size())
            .sum();
        let compressed: usize = self
            .projections()
            .filter(|p| !p.is_dense())
            .map(Projection::bytes)
            .sum();
        let screen = self.screen.as_ref().map_or(0, HeadScreen::bytes);
        (dense + compressed + screen) as u64
    }

    /// Every projection: per layer qkv, o, gate-up, down; then the LM head if it has its own.
    pub fn projections(&self) -> impl Iterator<Item = &Projection<R>> {
        self.layers
            .iter()
            .flat_map(DecoderLayer::projections)
            .chain(self.lm_head.as_ref())
    }

    /// Every dense upload (compressed projections are not listed), in upload order.
    pub fn weights(&self) -> Vec<&Weight<R>> {
        let mut all = vec![&self.embed_tokens];
        all.extend(self.layers.iter().flat_map(DecoderLayer::dense_weights));
        all.push(&self.norm);
        all.extend(self.lm_head.iter().flat_map(Projection::dense_weights));
        all
    }

    pub fn client(&self) -> &ComputeClient<R> {
        &self.client
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The compute dtype of weights, activations and KV cache.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Context length the caches made for this model hold.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// A KV cache of `max_len` positions in the compute dtype.
    pub fn new_cache(&self) -> Result<KvCache<R>> {
        KvCache::for_config(&self.client, &self.config, self.max_len, self.dtype)
    }

    /// The preallocated buffers of the decode step.
    pub fn new_decode_buffers(&self) -> Result<DecodeBuffers<R>> {
        let mut step = DecodeBuffers::new(&self.client, &self.config, self.dtype, self.max_len)?;
        if self.screen.is_some() {
            let vocab = self.config.vocab_size;
            step.screen = Some(ScreenBuffers::new(&self.client, vocab, self.dtype)?);
        }
        Ok(step)
    }

    fn heads(&self) -> HeadShape {
        HeadShape {
            q_heads: self.config.num_attention_heads,
            kv_heads: self.config.num_key_value_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// The context of one step over `act`, for the append that `cache` has begun.
    fn context<'a>(
        &'a self,
        act: &'a Activations<R>,
        cache: &'a KvCache<R>,
        kv_len: CacheLen<'a, R>,
        decode: Option<&'a DecodeBuffers<R>>,
    ) -> StepContext<'a, R> {
        StepContext {
            client: &self.client,
            act,
            start: cache.start(),
            kv_len,
            ragged: None,
            rope: &self.rope,
            heads: self.heads(),
            eps: self.config.rms_norm_eps as f32,
            scale: 1.0 / (self.config.head_dim as f32).sqrt(),
            workspace: decode.map(|d| &d.workspace),
            scratch: decode.map(|d| &d.scratch),
        }
    }

    fn check_cache(&self, cache: &KvCache<R>, op: &'static str) -> Result<()> {
        if cache.dtype() != self.dtype {
            return Err(ModelError::param(
                op,
                format!(
                    "cache is {}, the model computes in {}",
                    cache.dtype(),
                    self.dtype
                ),
            ));
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::param(
                "tokens",
                "prefill needs at least one token",
            ));
        }
        let vocab = self.config.vocab_size;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::param(
                "tokens",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            ));
        }
        Ok(())
    }

    /// The forward pass of `ids` over `s`: embedding into `s.act.hidden`, every layer, the final
    /// norm and the LM head into `head`.
    /// The layers, the final norm and the LM head on the embedding rows of `ids`, or, without
    /// ids, on the row already in `s.act.hidden`.
    fn forward(
        &self,
        s: &StepContext<'_, R>,
        ids: Option<&DeviceTensor<R>>,
        cache: &[LayerCache<R>],
        head: Head<'_, R>,
    ) -> Result<()> {
        let c = &self.client;
        if let Some(ids) = ids {
            ops::embedding::embedding_into(c, &self.embed_tokens.tensor, ids, &s.act.hidden)?;
        }
        for (layer, layer_cache) in self.layers.iter().zip(cache) {
            layer.forward(s, layer_cache)?;
        }
        let x = match head.last_row {
            Some((index, row)) => {
                // The embedding kernel is a gather: only that row reaches the LM head.
                ops::embedding::embedding_into(c, &s.act.hidden, index, row)?;
                row
            }
            None => &s.act.hidden,
        };
        // The final norm stays a kernel of its own: fused into the LM head's GEMV, each of its
        // ~19k cubes would reduce x's squares again before its first weight load.
        ops::norm::rms_norm_into(c, x, &self.norm.tensor, s.eps, head.normed)?;
        match head.logits {
            Some(logits) => self.logits_into(head.normed, logits, s.scratch),
            None => Ok(()),
        }
    }

    /// Each row's argmax of `logits` into `ids`, with the rows split across cubes where the
    /// runtime allows it (the step's projection scratch holds the candidates). With `cache` (a
    /// one-sequence step, [`OneSequence`]) it also advances the cache's device position and
    /// length to the next step's, writes the id to the slot of the length's parity
    /// ([`DecodeBuffers::chosen`]) and gathers the id's embedding row: the input of a step fed
    /// by this choice ([`StepInput::Chosen`]).
    fn greedy_into(
        &self,
        logits: &DeviceTensor<R>,
        ids: &DeviceTensor<R>,
        scratch: &ProjectionScratch<R>,
        cache: Option<OneSequence<'_, R>>,
    ) -> Result<()> {
        let split = scratch.linear.split_k();
        match cache {
            Some(OneSequence {
                cache,
                slots,
                hidden,
            }) => {
                let counters = [cache.start(), cache.end()];
                let next_row = ops::argmax::NextRow {
                    table: &self.embed_tokens.tensor,
                    row: hidden,
                };
                ops::argmax::argmax_split_advance_into(
                    &self.client,
                    logits,
                    ids,
                    split,
                    counters,
                    [&slots[0], &slots[1]],
                    Some(next_row),
                )?
            }
            None => ops::argmax::argmax_split_into(&self.client, logits, ids, split)?,
        }
        Ok(())
    }

    /// The logits `x · lm_headᵀ` (`embed_tokens` when tied) into `out`.
    fn logits_into(
        &self,
        x: &DeviceTensor<R>,
        out: &DeviceTensor<R>,
        scratch: Option<&ProjectionScratch<R>>,
    ) -> Result<()> {
        match &self.lm_head {
            Some(head) => head.forward_into(&self.client, x, None, out, scratch),
            None => {
                // The tied head runs on the embedding table with the scratch's options, so that
                // a batched step's logits do not depend on its row count either.
                let table = &self.embed_tokens.tensor;
                let opts = LinearWorkspace::product_options(scratch.map(|s| &s.linear));
                linear_opts_into(&self.client, x, None, table, None, None, out, opts)?;
                Ok(())
            }
        }
    }

    /// Runs `tokens` (positions `cache.len()..`) through the model in one pass, appends their
    /// keys and values to `cache`, and returns the logits in the compute dtype: `[1, vocab]`
    /// for [`Logits::Last`], `[T, vocab]` for [`Logits::All`]. Allocates its activations.
    pub fn prefill(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<R>,
        logits: Logits,
    ) -> Result<DeviceTensor<R>> {
        self.check_tokens(tokens)?;
        self.check_cache(cache, "prefill")?;
        let c = &self.client;
        let t = tokens.len();
        cache.begin_append(c, t)?;
        let act = Activations::new(c, &self.config, self.dtype, t)?;
        let ids = DeviceTensor::from_slice(c, tokens, &[t])?;
        let (h, v) = (self.config.hidden_size, self.config.vocab_size);
        let last = logits == Logits::Last && t > 1;
        let rows = if logits == Logits::All { t } else { 1 };
        let gather = if last {
            let index = DeviceTensor::from_slice(c, &[(t - 1) as u32], &[1])?;
            Some((index, DeviceTensor::empty(c, &[1, h], self.dtype)))
        } else {
            None
        };
        let normed = match &gather {
            Some(_) => DeviceTensor::empty(c, &[1, h], self.dtype),
            None => act.normed.clone(),
        };
        let out = DeviceTensor::empty(c, &[rows, v], self.dtype);
        let s = self.context(&act, cache, CacheLen::Host(cache.len() + t), None);
        let head = Head {
            last_row: gather.as_ref().map(|(index, row)| (index, row)),
            normed: &normed,
            logits: Some(&out),
        };
        self.forward(&s, Some(&ids), cache.layers(), head)?;
        cache.commit_append()?;
        Ok(out)
    }

    /// One decode step, allocation-free and graph-capturable: reads the token id from
    /// `step.token` (written with [`DecodeBuffers::write_token`]) and its position and the cache
    /// length from the append of one position that `cache` has begun
    /// ([`KvCache::begin_append`]), writes the token's keys and values at that position, and
    /// leaves the logits in `step.logits` and their argmax in `step.next_token`. Its last
    /// kernel then advances the cache's device copies of the position and length by one (the
    /// next step's values). The caller commits the append afterwards with
    /// [`KvCache::commit_step`], after which the next one-position append writes nothing
    /// ([`KvCache::commit_append`] forgets the advance: the next append writes both).
    pub fn decode_step(&self, cache: &KvCache<R>, step: &DecodeBuffers<R>) -> Result<()> {
        self.decode_step_reading(cache, step, StepInput::Token, None)
    }

    /// [`Self::decode_step`] on the id in `token`, with the attention planned for the cache's
    /// first `rows` rows where given (views of the same buffers; errors unless the step's keys
    /// fit them): where those rows take a faster launch than the whole cache
    /// ([`ops::attention::clustered_decode_keys`]), a step with a short context runs it.
    ///
    /// With [`StepInput::Chosen`] the step runs on the id the step before chose (its argmax,
    /// never copied to the host first), whose embedding row that argmax already gathered, and
    /// overwrites both with its own. Greedy decoding then runs one step ahead of the host: the
    /// host queues the read of a step's choice, then this step, and only then waits for the
    /// choice (the read sees the id from before this step: stream order). Such a step screens
    /// the LM head where the model has a screen and `step` its buffers, and then leaves
    /// `step.logits` unwritten ([`Self::fill_step_logits`]).
    pub(crate) fn decode_step_reading(
        &self,
        cache: &KvCache<R>,
        step: &DecodeBuffers<R>,
        input: StepInput,
        rows: Option<usize>,
    ) -> Result<()> {
        self.check_cache(cache, "decode_step")?;
        step.check_dtype(self.dtype)?;
        if cache.pending() != Some(1) {
            return Err(ModelError::param(
                "decode_step",
                "the cache has no append of one position begun (KvCache::begin_append)",
            ));
        }
        let s = self.context(&step.act, cache, CacheLen::Device(cache.end()), Some(step));
        // A step on the previous step's argmax is greedy: its LM head may be screened.
        let screened = match (input, &self.screen, &step.screen) {
            (StepInput::Chosen, Some(screen), Some(buffers)) => Some((screen, buffers)),
            _ => None,
        };
        let head = Head {
            last_row: None,
            normed: &step.act.normed,
            logits: screened.is_none().then_some(&step.logits),
        };
        // The embedding of `step.token` (the first kernel, where there is one) reads its row
        // before the argmax (the last) gathers the next one into the same activation.
        let ids = match input {
            StepInput::Token => Some(&step.token),
            StepInput::Chosen => None,
        };
        let views;
        let layers = match rows {
            Some(rows) => {
                views = cache.first_rows(rows)?;
                &views[..]
            }
            None => cache.layers(),
        };
        self.forward(&s, ids, layers, head)?;
        let one = OneSequence {
            cache,
            slots: &step.chosen,
            hidden: &step.act.hidden,
        };
        match screened {
            Some((screen, buffers)) => self.screened_greedy_into(screen, buffers, step, one),
            None => self.greedy_into(&step.logits, &step.next_token, &step.scratch, Some(one)),
        }
    }

    /// The argmax of a step's logits through the screened LM head, advancing and gathering as
    /// [`Self::greedy_into`] does; `step.logits` is not written ([`Self::fill_step_logits`]).
    fn screened_greedy_into(
        &self,
        screen: &HeadScreen<R>,
        buffers: &ScreenBuffers<R>,
        step: &DecodeBuffers<R>,
        one: OneSequence<'_, R>,
    ) -> Result<()> {
        use ops::linear::{Epilogue, Linear};
        let c = &self.client;
        let x = &step.act.normed;
        let ws = Some(&step.scratch.linear);
        let approx = &buffers.approx;
        screen
            .head
            .linear
            .forward_into(c, x, Epilogue::NONE, approx, ws)?;
        let screened = ops::argmax::screened::Screened {
            x,
            w: self
                .float_head()
                .expect("a screen is built on a float head"),
            approx,
            coef: &screen.head.coef,
        };
        let next_row = ops::argmax::NextRow {
            table: &self.embed_tokens.tensor,
            row: one.hidden,
        };
        ops::argmax::screened::screened_argmax_advance_into(
            c,
            screened,
            &step.next_token,
            &buffers.scratch,
            [one.cache.start(), one.cache.end()],
            [&one.slots[0], &one.slots[1]],
            Some(next_row),
        )?;
        Ok(())
    }

    /// The float LM head's weight (the embedding table when tied); `None` for a compressed head.
    fn float_head(&self) -> Option<&DeviceTensor<R>> {
        match &self.lm_head {
            Some(head) => head.dense_weights().first().map(|w| &w.tensor),
            None => Some(&self.embed_tokens.tensor),
        }
    }

    /// The full logits of the last decode step into `step.logits`, from the final norm's output
    /// the step left in `step.act.normed`: what a screened step did not write.
    pub(crate) fn fill_step_logits(&self, step: &DecodeBuffers<R>) -> Result<()> {
        self.logits_into(&step.act.normed, &step.logits, Some(&step.scratch))
    }

    /// One decode step of a ragged batch, allocation-free and graph-capturable: row `b` runs
    /// token `step.tokens[b]` at `(position, slot)` `step.seqs[b]` of `slots` (the host writes
    /// both with [`BatchBuffers::write_rows`]), appends its keys and values there, and leaves
    /// its logits in row `b` of `step.logits` and their argmax in `step.next_tokens[b]`.
    ///
    /// Each row's logits equal, bit for bit, those of a [`Self::decode_step`] of that sequence
    /// alone where every projection runs the GEMV at both row counts (dense and W4A16 weights,
    /// up to [`BatchBuffers::MAX_ROWS`] rows): the GEMV, the attention and the QKV append compute
    /// each row the same whatever the batch is.
    pub fn decode_batch(&self, slots: &SlotCache<R>, step: &BatchBuffers<R>) -> Result<()> {
        if slots.dtype() != self.dtype {
            return Err(ModelError::param(
                "decode_batch",
                format!(
                    "the slot cache is {}, the model computes in {}",
                    slots.dtype(),
                    self.dtype
                ),
            ));
        }
        step.check_dtype(self.dtype)?;
        let s = StepContext {
            client: &self.client,
            act: &step.act,
            start: &step.seqs,
            kv_len: CacheLen::Device(&step.seqs),
            ragged: Some(&step.seqs),
            rope: &self.rope,
            heads: self.heads(),
            eps: self.config.rms_norm_eps as f32,
            scale: 1.0 / (self.config.head_dim as f32).sqrt(),
            workspace: Some(&step.workspace),
            scratch: Some(&step.scratch),
        };
        let head = Head {
            last_row: None,
            normed: &step.act.normed,
            logits: Some(&step.logits),
        };
        self.forward(&s, Some(&step.tokens), slots.layers(), head)?;
        self.greedy_into(&step.logits, &step.next_tokens, &step.scratch, None)
    }
}
