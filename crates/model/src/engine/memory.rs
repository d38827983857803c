//! The device memory a model will hold, computed from the config before anything is allocated,
//! and the check of that plan against what the device offers.
//!
//! Two limits apply. wgpu caps every buffer a kernel binds (the storage-buffer binding limit,
//! which CubeCL reports as `max_page_size`; 128 MiB on lavapipe), and the device has a number of
//! free bytes (asked from the driver by the caller: CubeCL does not report it). A
//! context that breaks either is refused with the numbers and the largest context that fits,
//! instead of failing inside an allocation (or computing tables for hours first: the RoPE
//! tables of a 10^8-position context are 25 GB on the host).

use ops::DType;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// What the device offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The runtime's limit on one buffer, in bytes (`None`: no limit below the free memory).
    pub max_allocation: Option<u64>,
    /// Bytes free on the device before loading (`None`: unknown, only the per-allocation limit
    /// is checked).
    pub free: Option<u64>,
}

/// Device bytes of a model with a context of `max_len` positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPlan {
    pub max_len: usize,
    /// All weights as they will be stored (compressed ones estimated from their bit width).
    pub weights: u64,
    /// The largest single weight tensor.
    pub largest_weight: u64,
    /// Keys and values of every layer (`2 * layers` buffers).
    pub kv_cache: u64,
    /// The f32 cos and sin tables of RoPE (two buffers).
    pub rope: u64,
    /// Bytes per position of the context (KV cache and RoPE tables).
    pub per_position: u64,
    /// Layers of the model (the KV cache is `2 * layers` buffers).
    layers: usize,
    kv_row: u64,
    rope_row: u64,
}

impl MemoryPlan {
    pub fn new(
        config: &ModelConfig,
        dtype: DType,
        max_len: usize,
        weights: u64,
        largest_weight: u64,
    ) -> Self {
        let kv_row = (config.kv_dim() * dtype.size()) as u64;
        // cos and sin, [max_len, head_dim / 2] f32 each.
        let rope_row = (config.head_dim / 2 * 4) as u64;
        let layers = config.num_hidden_layers;
        let per_position = 2 * layers as u64 * kv_row + 2 * rope_row;
        let len = max_len as u64;
        Self {
            max_len,
            weights,
            largest_weight,
            kv_cache: (2 * layers as u64).saturating_mul(len.saturating_mul(kv_row)),
            rope: 2 * len.saturating_mul(rope_row),
            per_position,
            layers,
            kv_row,
            rope_row,
        }
    }

    /// Everything the plan holds.
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.kv_cache)
            .saturating_add(self.rope)
    }

    /// The largest context whose buffers all fit (`0`: not even one position).
    pub fn max_len_that_fits(&self, device: &DeviceMemory) -> usize {
        let mut most = match device.max_allocation {
            Some(max) => (max / self.kv_row.max(1)).min(max / self.rope_row.max(1)),
            None => u64::MAX,
        };
        if let Some(free) = device.free {
            most = most.min(free.saturating_sub(self.weights) / self.per_position.max(1));
        }
        usize::try_from(most).unwrap_or(usize::MAX)
    }

    /// Errors unless the whole plan is within the free memory and every buffer within the
    /// allocation limit.
    pub fn check(&self, device: &DeviceMemory, runtime: &str) -> Result<()> {
        let kv_buffer = (self.max_len as u64).saturating_mul(self.kv_row);
        let rope_buffer = (self.max_len as u64).saturating_mul(self.rope_row);
        let max = device.max_allocation.unwrap_or(u64::MAX);
        let fits = || match self.max_len_that_fits(device) {
            0 => "no context fits".to_string(),
            n => format!("the largest context that fits is {n} (--max-len)"),
        };
        if self.largest_weight > max {
            return Err(ModelError::DeviceMemory(format!(
                "a weight tensor needs {} but the {runtime} device allows at most {} per buffer",
                bytes(self.largest_weight),
                bytes(max)
            )));
        }
        if let Some(free) = device.free {
            if self.total() > free {
                return Err(ModelError::DeviceMemory(format!(
                    "a context of {} positions does not fit: the model needs {} on the device \
                     (weights {}, KV cache {} in {} buffers, RoPE tables {}) but the {runtime} \
                     device has {} free; {}",
                    self.max_len,
                    bytes(self.total()),
                    bytes(self.weights),
                    bytes(self.kv_cache),
                    2 * self.layers,
                    bytes(self.rope),
                    bytes(free),
                    fits()
                )));
            }
        }
        if kv_buffer > max || rope_buffer > max {
            let (what, size) = if kv_buffer >= rope_buffer {
                ("one layer's keys", kv_buffer)
            } else {
                ("the RoPE table", rope_buffer)
            };
            return Err(ModelError::DeviceMemory(format!(
                "a context of {} positions does not fit: {what} need {} but the {runtime} \
                 device allows at most {} per buffer; {}",
                self.max_len,
                bytes(size),
                bytes(max),
                fits()
            )));
        }
        Ok(())
    }
}

/// Bytes for people, with the exact count (`12.8 GB (12800000000 bytes)`).
pub fn bytes(n: u64) -> String {
    const UNITS: [(&str, f64); 4] = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    let human = UNITS
        .iter()
        .find(|(_, s)| n as f64 >= *s)
        .map(|(u, s)| format!("{:.1} {u}", n as f64 / s))
        .unwrap_or_else(|| format!("{n} B"));
    format!("{human} ({n} bytes)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    fn config() -> ModelConfig {
        // The 1.5B shape: 28 layers, 2 KV heads of 128.
        let value = json!({
            "architectures": ["Qwen2ForCausalLM"],
            "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
            "num_hidden_layers": 28, "num_key_value_heads": 2, "vocab_size": 151936,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": false, "torch_dtype": "bfloat16"
        });
        ModelConfig::from_value(&value, Path::new("config.json")).unwrap()
    }

    #[test]
    fn kv_cache_bytes_follow_the_config() {
        let plan = MemoryPlan::new(&config(), DType::BF16, 4096, 0, 0);
        // 2 * 28 layers * 4096 * 256 * 2 bytes: 117 MB, as the default context's docs say.
        assert_eq!(plan.kv_cache, 2 * 28 * 4096 * 256 * 2);
        assert_eq!(plan.rope, 2 * 4096 * 64 * 4);
        assert_eq!(plan.per_position, 2 * 28 * 256 * 2 + 2 * 64 * 4);
    }

    #[test]
    fn a_huge_context_is_refused_with_both_numbers() {
        let device = DeviceMemory {
            max_allocation: None,
            free: Some(140_000_000_000),
        };
        let plan = MemoryPlan::new(&config(), DType::BF16, 100_000_000, 3_500_000_000, 0);
        let err = plan.check(&device, "cuda").unwrap_err().to_string();
        assert!(
            err.contains(&format!("has {} free", bytes(140_000_000_000))),
            "{err}"
        );
        assert!(
            err.contains(&format!("needs {}", bytes(plan.total()))),
            "{err}"
        );
        let fits = plan.max_len_that_fits(&device);
        assert!(
            err.contains(&format!("largest context that fits is {fits}")),
            "{err}"
        );
        // The largest context does fit, one more position does not.
        let at = MemoryPlan::new(&config(), DType::BF16, fits, 3_500_000_000, 0);
        at.check(&device, "cuda").unwrap();
        let over = MemoryPlan::new(&config(), DType::BF16, fits + 1, 3_500_000_000, 0);
        assert!(over.check(&device, "cuda").is_err());
    }

    #[test]
    fn one_buffer_over_the_allocation_limit_is_refused() {
        let device = DeviceMemory {
            max_allocation: Some(1 << 27),
            free: None,
        };
        let plan = MemoryPlan::new(&config(), DType::F32, 1 << 20, 0, 0);
        let err = plan.check(&device, "wgpu").unwrap_err().to_string();
        assert!(err.contains("per buffer"), "{err}");
        // 2^27 / (256 * 4) positions per KV buffer.
        assert_eq!(plan.max_len_that_fits(&device), 1 << 17);
        let weights = MemoryPlan::new(&config(), DType::F32, 16, 0, 1 << 28);
        assert!(weights.check(&device, "wgpu").is_err());
    }
}
