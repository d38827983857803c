//! The preallocated KV cache: per layer, keys and values of shape `[max_len, Hkv, D]`.
//!
//! Allocated once for the whole context (llama2.c's layout, one buffer per layer and kind) so
//! that neither prefill nor decode ever grows or copies it; GQA reads the `Hkv` heads in place
//! (query head `h` uses KV head `h / group`), never a repeated copy.
//!
//! The number of valid positions has one source of truth, the host length. The kernels of a
//! captured decode step cannot be told it (a replayed graph reads the same buffers every time),
//! so an append goes through [`KvCache::begin_append`], the one place that writes the device
//! copies the kernels read: `start` (`u32[1]`, the first position appended: RoPE row and cache
//! row) and `end` (`u32[1]`, the length after the append: the attention length). The forward
//! pass then writes the rows, and [`KvCache::commit_append`] advances the host length. A decode
//! step advances the device copies itself after its last read of them (the argmax kernel adds
//! one to each); [`KvCache::commit_step`] records that, and the next one-position
//! `begin_append` then writes nothing, so that replays of a captured step follow each other
//! without host-to-device copies in between.

use cubecl::prelude::*;
use ops::{DType, DeviceTensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// Keys and values of one layer.
pub struct LayerCache<R: Runtime> {
    /// `[max_len, Hkv, D]`
    pub k: DeviceTensor<R>,
    /// `[max_len, Hkv, D]`
    pub v: DeviceTensor<R>,
}

impl<R: Runtime> LayerCache<R> {
    /// The first `rows` positions of keys and values `[max_len, Hkv, D]`: views of the same
    /// buffers (errors past `max_len`).
    pub fn first_rows(&self, rows: usize) -> Result<Self> {
        let prefix = |t: &DeviceTensor<R>| {
            let s = t.shape();
            t.view(&[rows, s[1], s[2]], &[s[1] * s[2], s[2], 1])
        };
        Ok(Self {
            k: prefix(&self.k)?,
            v: prefix(&self.v)?,
        })
    }
}

impl<R: Runtime> std::fmt::Debug for LayerCache<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LayerCache {{ k, v: {:?} {} }}",
            self.k.shape(),
            self.k.dtype()
        )
    }
}

/// The KV cache of a whole model.
pub struct KvCache<R: Runtime> {
    layers: Vec<LayerCache<R>>,
    /// Valid positions: the one source of truth.
    len: usize,
    /// Positions of the append in progress (between `begin_append` and `commit_append`).
    pending: Option<usize>,
    /// `u32[1]` device copies for the append in progress: `len` and `len + pending`.
    start: DeviceTensor<R>,
    end: DeviceTensor<R>,
    /// Whether the device copies already hold `len` and `len + 1` (a decode step advanced them
    /// and nothing moved the length since).
    advanced: bool,
    max_len: usize,
    num_kv_heads: usize,
    head_dim: usize,
    dtype: DType,
}

impl<R: Runtime> std::fmt::Debug for KvCache<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KvCache {{ layers: {}, len: {}/{}, [Hkv, D]: [{}, {}], dtype: {} }}",
            self.layers.len(),
            self.len,
            self.max_len,
            self.num_kv_heads,
            self.head_dim,
            self.dtype
        )
    }
}

impl<R: Runtime> KvCache<R> {
    /// Allocates the cache for `max_len` positions (uninitialised: only positions below `len`
    /// are ever read).
    pub fn new(
        client: &ComputeClient<R>,
        num_layers: usize,
        max_len: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: DType,
    ) -> Result<Self> {
        if max_len == 0 || num_layers == 0 || num_kv_heads == 0 || head_dim == 0 {
            return Err(ModelError::param(
                "max_len",
                format!("KV cache of {num_layers} layers x [{max_len}, {num_kv_heads}, {head_dim}] is empty"),
            ));
        }
        if max_len > u32::MAX as usize {
            return Err(ModelError::param(
                "max_len",
                format!("{max_len} does not fit in u32"),
            ));
        }
        let shape = [max_len, num_kv_heads, head_dim];
        let layers = (0..num_layers)
            .map(|_| LayerCache {
                k: DeviceTensor::empty(client, &shape, dtype),
                v: DeviceTensor::empty(client, &shape, dtype),
            })
            .collect();
        Ok(Self {
            layers,
            len: 0,
            pending: None,
            start: DeviceTensor::from_slice(client, &[0u32], &[1])?,
            end: DeviceTensor::from_slice(client, &[0u32], &[1])?,
            advanced: false,
            max_len,
            num_kv_heads,
            head_dim,
            dtype,
        })
    }

    /// A cache shaped for `config`.
    pub fn for_config(
        client: &ComputeClient<R>,
        config: &ModelConfig,
        max_len: usize,
        dtype: DType,
    ) -> Result<Self> {
        Self::new(
            client,
            config.num_hidden_layers,
            max_len,
            config.num_key_value_heads,
            config.head_dim,
            dtype,
        )
    }

    /// Bytes of device memory the cache holds: `2 * layers * max_len * Hkv * D * size(dtype)`.
    pub fn bytes_for(config: &ModelConfig, max_len: usize, dtype: DType) -> usize {
        2 * config.num_hidden_layers * max_len * config.kv_dim() * dtype.size()
    }

    /// Every layer's first `rows` positions, as views of the same buffers (a decode step's
    /// attention is planned for the rows its cache tensors have). Errors unless the positions
    /// written so far and those of the append in progress fit.
    pub fn first_rows(&self, rows: usize) -> Result<Vec<LayerCache<R>>> {
        let used = self.len + self.pending.unwrap_or(0);
        if used > rows || rows > self.max_len {
            return Err(ModelError::param(
                "rows",
                format!(
                    "a view of {rows} cache rows: {used} are in use, the cache has {}",
                    self.max_len
                ),
            ));
        }
        self.layers.iter().map(|l| l.first_rows(rows)).collect()
    }

    pub fn layer(&self, i: usize) -> &LayerCache<R> {
        &self.layers[i]
    }

    pub fn layers(&self) -> &[LayerCache<R>] {
        &self.layers
    }

    /// Valid positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn max_len(&self) -> usize {
        self.max_len
    }

    pub fn remaining(&self) -> usize {
        self.max_len - self.len
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Errors unless `n` more positions fit.
    pub fn check_room(&self, n: usize) -> Result<()> {
        if n > self.remaining() {
            return Err(ModelError::ContextOverflow {
                needed: self.len + n,
                max_len: self.max_len,
            });
        }
        Ok(())
    }

    /// Starts an append of `n` positions at the current length: checks that they fit and writes
    /// the device copies the kernels read, `start = len` and `end = len + n` (host to device,
    /// so outside any graph capture), unless a decode step already advanced them to these
    /// values ([`Self::commit_step`]). Nothing but this method and the decode step's argmax
    /// writes them.
    pub fn begin_append(&mut self, client: &ComputeClient<R>, n: usize) -> Result<()> {
        self.check_room(n)?;
        if n == 0 {
            return Err(ModelError::param("append", "nothing to append"));
        }
        self.pending = None;
        if !(n == 1 && self.advanced) {
            let start = self.len as u32;
            let end = (self.len + n) as u32;
            self.start.write_bytes(client, &start.to_le_bytes())?;
            self.end.write_bytes(client, &end.to_le_bytes())?;
        }
        self.advanced = false;
        self.pending = Some(n);
        Ok(())
    }

    /// Whether the device copies hold `len` and `len + 1` without a write (the last append was
    /// a decode step's, committed with [`Self::commit_step`]).
    pub fn device_advanced(&self) -> bool {
        self.advanced
    }

    /// The positions of the append in progress, if one was begun and not committed.
    pub fn pending(&self) -> Option<usize> {
        self.pending
    }

    /// `u32[1]`: the first position of the append in progress.
    pub fn start(&self) -> &DeviceTensor<R> {
        &self.start
    }

    /// `u32[1]`: the length once the append in progress is committed.
    pub fn end(&self) -> &DeviceTensor<R> {
        &self.end
    }

    /// Records that the rows of the append in progress were written.
    pub fn commit_append(&mut self) -> Result<()> {
        let n = self
            .pending
            .take()
            .ok_or_else(|| ModelError::param("append", "no append in progress"))?;
        self.len += n;
        Ok(())
    }

    /// [`Self::commit_append`] of the one position a decode step
    /// ([`crate::Model::decode_step`]) appended: that step also advanced the device copies to
    /// the next position's values, so the next one-position append writes nothing. Only for
    /// an append that a decode step ran on (ran to its end, or was queued to).
    pub fn commit_step(&mut self) -> Result<()> {
        if self.pending != Some(1) {
            return Err(ModelError::param(
                "append",
                "no append of one position (a decode step's) in progress",
            ));
        }
        self.commit_append()?;
        self.advanced = true;
        Ok(())
    }

    /// Keeps only the first `len` positions (their keys and values are untouched; later appends
    /// overwrite the rest). A `len` above the current length changes nothing.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.pending = None;
        self.advanced = false;
    }

    /// Forgets every position (the buffers are kept).
    pub fn reset(&mut self) {
        self.len = 0;
        self.pending = None;
        self.advanced = false;
    }
}
