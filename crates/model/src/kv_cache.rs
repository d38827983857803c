//! The preallocated KV cache: per layer, keys and values of shape `[max_len, Hkv, D]`.
//!
//! Allocated once for the whole context (llama2.c's layout, one buffer per layer and kind) so
//! that neither prefill nor decode ever grows or copies it; GQA reads the `Hkv` heads in place
//! (query head `h` uses KV head `h / group`), never a repeated copy. The number of valid
//! positions is kept twice: on the host (for validation and bookkeeping) and in a device `u32[1]`
//! buffer that the attention kernels of a captured decode step read.

use cubecl::prelude::*;
use ops::{DType, DeviceTensor};

use crate::config::Qwen2Config;
use crate::error::{ModelError, Result};

/// Keys and values of one layer.
pub struct LayerCache<R: Runtime> {
    /// `[max_len, Hkv, D]`
    pub k: DeviceTensor<R>,
    /// `[max_len, Hkv, D]`
    pub v: DeviceTensor<R>,
}

/// The KV cache of a whole model.
pub struct KvCache<R: Runtime> {
    layers: Vec<LayerCache<R>>,
    /// `u32[1]`: the number of valid positions, as the kernels see it.
    len_buffer: DeviceTensor<R>,
    len: usize,
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
        let len_buffer = DeviceTensor::from_slice(client, &[0u32], &[1])?;
        Ok(Self {
            layers,
            len_buffer,
            len: 0,
            max_len,
            num_kv_heads,
            head_dim,
            dtype,
        })
    }

    /// A cache shaped for `config`.
    pub fn for_config(
        client: &ComputeClient<R>,
        config: &Qwen2Config,
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
    pub fn bytes_for(config: &Qwen2Config, max_len: usize, dtype: DType) -> usize {
        2 * config.num_hidden_layers * max_len * config.kv_dim() * dtype.size()
    }

    pub fn layer(&self, i: usize) -> &LayerCache<R> {
        &self.layers[i]
    }

    pub fn layers(&self) -> &[LayerCache<R>] {
        &self.layers
    }

    /// Valid positions (host copy).
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

    /// The device `u32[1]` holding the number of valid positions, read by attention kernels.
    pub fn len_buffer(&self) -> &DeviceTensor<R> {
        &self.len_buffer
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

    /// Records that `n` positions were written (host side only: the device length buffer is
    /// written by [`KvCache::sync_len`] or by the decode step's own inputs).
    pub fn advance(&mut self, n: usize) -> Result<()> {
        self.check_room(n)?;
        self.len += n;
        Ok(())
    }

    /// Copies the host length into the device buffer (outside any graph capture).
    pub fn sync_len(&self, client: &ComputeClient<R>) -> Result<()> {
        self.len_buffer
            .write_bytes(client, &(self.len as u32).to_le_bytes())?;
        Ok(())
    }

    /// Forgets every position (the buffers are kept).
    pub fn reset(&mut self, client: &ComputeClient<R>) -> Result<()> {
        self.len = 0;
        self.sync_len(client)
    }
}
