//! Continuous batching's device side: several sequences, each in its own slot of one KV cache,
//! decoded together.
//!
//! - [`SlotCache`]: per layer, keys and values `[slots, max_len, Hkv, D]`, allocated once for the
//!   configured number of sequences (a request that finds no free slot waits; one sequence can
//!   never write into another's slot).
//! - [`BatchBuffers`]: everything a batched decode step of `rows` sequences writes, with the
//!   rows' tokens and `(position, slot)` pairs in device buffers the host writes before each
//!   step, so the step is captured once per row count and replayed.
//! - [`BatchSession`]: a model with its slot cache, the [`BatchLm`] a scheduler drives. A new
//!   sequence is prefilled on its own (into a one-sequence cache, then copied into its slot);
//!   then each step runs every active sequence's next token at once, with the projections at
//!   M = rows (the weights are read once per step, not once per sequence).
//!
//! A step of `n` sequences runs with the smallest row count of 1, 2, 4, 8, 16 (up to the
//! session's `max_batch`, which is itself a row count) that holds them; the rows past `n` decode
//! token 0 at position 0 of a spare slot no sequence owns, and their results are dropped. The
//! projections run the GEMV up to [`BatchBuffers::MAX_ROWS`] rows, which, like the attention and
//! the QKV append, computes each row the same whatever the other rows are: a sequence's tokens
//! do not depend on what it is batched with (for dense and W4A16 weights).

use cubecl::prelude::*;
use ops::attention::{kv_cache_write_into, AttentionWorkspace, KvLen};
use ops::{DType, DeviceTensor};

use crate::config::ModelConfig;
use crate::engine::buffers::{check_buffers_dtype, Activations};
use crate::engine::device_lock;
use crate::engine::kv_cache::{KvCache, LayerCache};
use crate::engine::model::{Logits, Model};
use crate::engine::projection::{Projection, ProjectionScratch};
use crate::engine::session::StepGraph;
use crate::error::{ModelError, Result};

/// The KV cache of several sequences: per layer, keys and values `[slots, max_len, Hkv, D]`.
pub struct SlotCache<R: Runtime> {
    layers: Vec<LayerCache<R>>,
    slots: usize,
    max_len: usize,
    dtype: DType,
}

impl<R: Runtime> SlotCache<R> {
    /// Allocates `slots` sequences of `max_len` positions (uninitialised: a step reads only the
    /// positions up to each row's own).
    pub fn new(
        client: &ComputeClient<R>,
        config: &ModelConfig,
        slots: usize,
        max_len: usize,
        dtype: DType,
    ) -> Result<Self> {
        if slots == 0 || max_len == 0 {
            return Err(ModelError::param(
                "slots",
                format!("a slot cache of {slots} slots x {max_len} positions is empty"),
            ));
        }
        if slots * max_len > u32::MAX as usize / 2 {
            return Err(ModelError::param(
                "slots",
                format!("{slots} slots x {max_len} positions do not fit 32-bit row indices"),
            ));
        }
        let shape = [slots, max_len, config.num_key_value_heads, config.head_dim];
        let layers = (0..config.num_hidden_layers)
            .map(|_| LayerCache {
                k: DeviceTensor::empty(client, &shape, dtype),
                v: DeviceTensor::empty(client, &shape, dtype),
            })
            .collect();
        Ok(Self {
            layers,
            slots,
            max_len,
            dtype,
        })
    }

    /// Bytes of device memory a slot cache holds.
    pub fn bytes_for(config: &ModelConfig, slots: usize, max_len: usize, dtype: DType) -> usize {
        slots * KvCache::<R>::bytes_for(config, max_len, dtype)
    }

    pub fn layers(&self) -> &[LayerCache<R>] {
        &self.layers
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Copies the positions `cache` holds into slot `slot`.
    pub fn load(&self, client: &ComputeClient<R>, slot: usize, cache: &KvCache<R>) -> Result<()> {
        let len = cache.len();
        if slot >= self.slots || len > self.max_len || cache.dtype() != self.dtype {
            return Err(ModelError::param(
                "slot",
                format!(
                    "cannot copy {len} {} positions into slot {slot} of {} x {} {}",
                    cache.dtype(),
                    self.slots,
                    self.max_len,
                    self.dtype
                ),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        for (from, to) in cache.layers().iter().zip(&self.layers) {
            let s = to.k.shape();
            let (hkv, d) = (s[2], s[3]);
            let flat = |t: &DeviceTensor<R>| t.reshape(&[self.slots * self.max_len, hkv, d]);
            let from = from.first_rows(len)?;
            kv_cache_write_into(
                client,
                &from.k,
                &from.v,
                &flat(&to.k)?,
                &flat(&to.v)?,
                KvLen::Host(slot * self.max_len),
            )?;
        }
        Ok(())
    }
}

/// Everything one batched decode step of `rows` sequences reads and writes besides the weights
/// and the slot cache, allocated once so the step allocates nothing.
///
/// | buffer | shape | dtype | role |
/// |---|---|---|---|
/// | `tokens` | `[rows]` | u32 | each row's input token (host-written) |
/// | `seqs` | `[rows, 2]` | u32 | each row's `(position, slot)` (host-written) |
/// | `act` | `[rows, ..]` | compute | the layer activations |
/// | `logits` | `[rows, V]` | compute | output of the LM head |
/// | `next_tokens` | `[rows]` | u32 | device argmax of each row's logits |
pub struct BatchBuffers<R: Runtime> {
    pub dtype: DType,
    pub rows: usize,
    pub tokens: DeviceTensor<R>,
    pub seqs: DeviceTensor<R>,
    pub act: Activations<R>,
    pub logits: DeviceTensor<R>,
    pub next_tokens: DeviceTensor<R>,
    pub workspace: AttentionWorkspace<R>,
    pub scratch: ProjectionScratch<R>,
}

impl<R: Runtime> BatchBuffers<R> {
    /// The most rows a batched step takes: the projections' GEMV row limit.
    pub const MAX_ROWS: usize = ops::matmul::GEMV_MAX_M;

    pub fn new(
        client: &ComputeClient<R>,
        config: &ModelConfig,
        dtype: DType,
        rows: usize,
        max_len: usize,
    ) -> Result<Self> {
        if rows == 0 || rows > Self::MAX_ROWS {
            return Err(ModelError::param(
                "rows",
                format!(
                    "a batched step takes 1 to {} rows, not {rows}",
                    Self::MAX_ROWS
                ),
            ));
        }
        let (hq, hkv, d) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        );
        Ok(Self {
            dtype,
            rows,
            tokens: DeviceTensor::from_slice(client, &vec![0u32; rows], &[rows])?,
            seqs: DeviceTensor::from_slice(client, &vec![0u32; 2 * rows], &[rows, 2])?,
            act: Activations::new(client, config, dtype, rows)?,
            logits: DeviceTensor::empty(client, &[rows, config.vocab_size], dtype),
            next_tokens: DeviceTensor::from_slice(client, &vec![0u32; rows], &[rows])?,
            workspace: AttentionWorkspace::for_shapes(client, rows, hq, hkv, d, max_len),
            // Every row count plans its products as 16 rows: a sequence's logits do not
            // depend on how many others run with it.
            scratch: ProjectionScratch::for_rows(client, config, dtype, rows, true),
        })
    }

    /// Writes the step's rows, `(token, position, slot)` each (host to device, outside any
    /// capture window); rows past `rows.len()` get `padding` (token 0 at position 0 of that
    /// slot).
    pub fn write_rows(
        &self,
        client: &ComputeClient<R>,
        rows: &[(u32, u32, u32)],
        padding: u32,
    ) -> Result<()> {
        if rows.len() > self.rows {
            return Err(ModelError::param(
                "rows",
                format!("{} rows for a step of {}", rows.len(), self.rows),
            ));
        }
        let mut tokens = Vec::with_capacity(self.rows);
        let mut seqs = Vec::with_capacity(2 * self.rows);
        for i in 0..self.rows {
            let (t, p, s) = rows.get(i).copied().unwrap_or((0, 0, padding));
            tokens.push(t);
            seqs.extend([p, s]);
        }
        self.tokens
            .write_bytes(client, bytemuck::cast_slice(&tokens))?;
        self.seqs.write_bytes(client, bytemuck::cast_slice(&seqs))?;
        Ok(())
    }

    pub(crate) fn check_dtype(&self, dtype: DType) -> Result<()> {
        check_buffers_dtype("decode_batch", self.dtype, dtype)
    }
}

/// A model that decodes several sequences at once: what a continuous-batching scheduler
/// drives. Sequences live in slots `0..max_batch`; the scheduler owns the assignment.
pub trait BatchLm {
    /// Width of the logits.
    fn vocab_size(&self) -> usize;
    /// Positions each slot holds.
    fn max_len(&self) -> usize;
    /// Slots (sequences decoded together at most).
    fn max_batch(&self) -> usize;
    /// Positions slot `slot` holds.
    fn slot_len(&self, slot: usize) -> usize;
    /// Runs `tokens` through the model as a new sequence in `slot` (what it held is forgotten);
    /// the logits of its last position become the prefill's current logits.
    fn prefill(&mut self, slot: usize, tokens: &[u32]) -> Result<()>;
    /// The argmax of the last prefill's logits.
    fn prefill_argmax(&mut self) -> Result<u32>;
    /// The last prefill's logits (f32, `vocab_size` values) into `out`.
    fn prefill_logits(&mut self, out: &mut Vec<f32>) -> Result<()>;
    /// One decode step: for each `(slot, token)` (slots distinct), appends `token` to that
    /// slot's sequence; row `i`'s logits become current.
    fn decode(&mut self, rows: &[(usize, u32)]) -> Result<()>;
    /// The argmax of each row of the last step.
    fn decode_argmax(&mut self) -> Result<Vec<u32>>;
    /// The last step's logits, row after row (f32, `rows * vocab_size` values), into `out`.
    fn decode_logits(&mut self, out: &mut Vec<f32>) -> Result<()>;
    /// Forgets slot `slot`'s sequence.
    fn release(&mut self, slot: usize);
}

/// The buffers and the graph of one row count.
struct Bucket<R: Runtime> {
    buffers: BatchBuffers<R>,
    graph: StepGraph<R>,
}

/// A model with a slot cache: the [`BatchLm`] on the device (see the module docs).
pub struct BatchSession<R: Runtime> {
    model: Model<R>,
    /// `max_batch` slots for sequences and one spare for the padding rows.
    slots: SlotCache<R>,
    /// Where a new sequence is prefilled before it is copied into its slot.
    prefill: KvCache<R>,
    buckets: Vec<Bucket<R>>,
    lens: Vec<usize>,
    prefilled: Option<DeviceTensor<R>>,
    /// The bucket and row count of the last step.
    last: Option<(usize, usize)>,
}

impl<R: Runtime> BatchSession<R> {
    /// A session of `max_batch` slots (1 to [`BatchBuffers::MAX_ROWS`]) of the model's
    /// `max_len` positions each; batched steps replay CUDA graphs when `cuda_graphs` and the
    /// runtime and the model allow it.
    pub fn new(model: Model<R>, max_batch: usize, cuda_graphs: bool) -> Result<Self> {
        if max_batch == 0 || max_batch > BatchBuffers::<R>::MAX_ROWS {
            return Err(ModelError::param(
                "max_batch",
                format!(
                    "must be 1 to {}, not {max_batch}",
                    BatchBuffers::<R>::MAX_ROWS
                ),
            ));
        }
        let _device = device_lock::shared();
        let c = model.client().clone();
        let (config, dtype, max_len) = (model.config().clone(), model.dtype(), model.max_len());
        let slots = SlotCache::new(&c, &config, max_batch + 1, max_len, dtype)?;
        let prefill = model.new_cache()?;
        let graphs = cuda_graphs && model.projections().all(Projection::graph_safe);
        let mut sizes: Vec<usize> = (0..)
            .map(|i| 1usize << i)
            .take_while(|&n| n < max_batch)
            .collect();
        sizes.push(max_batch);
        let buckets = sizes
            .into_iter()
            .map(|rows| {
                Ok(Bucket {
                    buffers: BatchBuffers::new(&c, &config, dtype, rows, max_len)?,
                    graph: StepGraph::new(&c, graphs),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            model,
            slots,
            prefill,
            buckets,
            lens: vec![0; max_batch],
            prefilled: None,
            last: None,
        })
    }

    pub fn model(&self) -> &Model<R> {
        &self.model
    }

    /// Whether the step of `rows` rows currently replays a captured graph.
    pub fn uses_graph(&self, rows: usize) -> bool {
        self.bucket_for(rows)
            .is_some_and(|b| self.buckets[b].graph.ready())
    }

    fn bucket_for(&self, rows: usize) -> Option<usize> {
        self.buckets.iter().position(|b| b.buffers.rows >= rows)
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.lens.len() {
            return Err(ModelError::param(
                "slot",
                format!("{slot} is not below max_batch {}", self.lens.len()),
            ));
        }
        Ok(())
    }

    fn last_bucket(&self, op: &'static str) -> Result<(&BatchBuffers<R>, usize)> {
        let (b, n) = self
            .last
            .ok_or_else(|| ModelError::param(op, "no batched step has run yet"))?;
        Ok((&self.buckets[b].buffers, n))
    }
}

impl<R: Runtime> BatchLm for BatchSession<R> {
    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn max_len(&self) -> usize {
        self.slots.max_len()
    }

    fn max_batch(&self) -> usize {
        self.lens.len()
    }

    fn slot_len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    fn prefill(&mut self, slot: usize, tokens: &[u32]) -> Result<()> {
        self.check_slot(slot)?;
        let _device = device_lock::shared();
        self.lens[slot] = 0;
        self.prefilled = None;
        self.prefill.reset();
        let logits = self
            .model
            .prefill(tokens, &mut self.prefill, Logits::Last)?;
        self.slots.load(self.model.client(), slot, &self.prefill)?;
        self.lens[slot] = tokens.len();
        self.prefilled = Some(logits);
        Ok(())
    }

    fn prefill_argmax(&mut self) -> Result<u32> {
        let logits = self
            .prefilled
            .as_ref()
            .ok_or_else(|| ModelError::param("prefill_argmax", "no prefill has run yet"))?;
        let _device = device_lock::shared();
        let c = self.model.client();
        let ids = ops::argmax::argmax(c, logits)?.to_vec::<u32>(c)?;
        ids.first().copied().ok_or(ModelError::BadLogits {
            step: 0,
            detail: "empty logits".into(),
        })
    }

    fn prefill_logits(&mut self, out: &mut Vec<f32>) -> Result<()> {
        let logits = self
            .prefilled
            .as_ref()
            .ok_or_else(|| ModelError::param("prefill_logits", "no prefill has run yet"))?;
        let _device = device_lock::shared();
        *out = logits.to_f32_vec(self.model.client())?;
        Ok(())
    }

    fn decode(&mut self, rows: &[(usize, u32)]) -> Result<()> {
        let vocab = self.vocab_size();
        let max_len = self.max_len();
        let bucket = self.bucket_for(rows.len()).filter(|_| !rows.is_empty());
        let bucket = bucket.ok_or_else(|| {
            ModelError::param(
                "decode",
                format!(
                    "a step takes 1 to {} sequences, not {}",
                    self.lens.len(),
                    rows.len()
                ),
            )
        })?;
        let mut seen = vec![false; self.lens.len()];
        let mut table = Vec::with_capacity(rows.len());
        for &(slot, token) in rows {
            self.check_slot(slot)?;
            if std::mem::replace(&mut seen[slot], true) {
                return Err(ModelError::param(
                    "decode",
                    format!("slot {slot} appears twice in one step"),
                ));
            }
            if token as usize >= vocab {
                return Err(ModelError::param(
                    "token",
                    format!("{token} is outside the vocabulary of {vocab}"),
                ));
            }
            let pos = self.lens[slot];
            if pos >= max_len {
                return Err(ModelError::ContextOverflow {
                    needed: pos + 1,
                    max_len,
                });
            }
            table.push((token, pos as u32, slot as u32));
        }
        let c = self.model.client().clone();
        let padding = self.lens.len() as u32;
        let Bucket { buffers, graph } = &mut self.buckets[bucket];
        let _device = device_lock::for_step(graph.capturing());
        buffers.write_rows(&c, &table, padding)?;
        let (model, slots, step) = (&self.model, &self.slots, &*buffers);
        // SAFETY: the step reads and writes only buffers this session owns (weights, slot cache,
        // the bucket's buffers), which live as long as the graph, on the one client's stream.
        unsafe { graph.run(&c, || model.decode_batch(slots, step))? };
        for &(slot, _) in rows {
            self.lens[slot] += 1;
        }
        self.last = Some((bucket, rows.len()));
        Ok(())
    }

    fn decode_argmax(&mut self) -> Result<Vec<u32>> {
        let _device = device_lock::shared();
        let (buffers, n) = self.last_bucket("decode_argmax")?;
        let mut ids = buffers.next_tokens.to_vec::<u32>(self.model.client())?;
        ids.truncate(n);
        Ok(ids)
    }

    fn decode_logits(&mut self, out: &mut Vec<f32>) -> Result<()> {
        let _device = device_lock::shared();
        let (buffers, n) = self.last_bucket("decode_logits")?;
        *out = buffers.logits.to_f32_vec(self.model.client())?;
        out.truncate(n * self.model.config().vocab_size);
        Ok(())
    }

    fn release(&mut self, slot: usize) {
        if let Some(len) = self.lens.get_mut(slot) {
            *len = 0;
        }
    }
}
