//! The Qwen2 model: weights uploaded once under their Hugging Face names, the prefill and
//! decode entry points, and a [`Qwen2Session`] (model + KV cache + decode buffers) that the
//! generation loop drives.
//!
//! Loading is split in two so that everything that can be wrong with a checkpoint is found on
//! the host before anything is uploaded: [`plan_weights`] checks every tensor's presence, shape
//! and dtype against `config.json` (tests run it without a device), then [`Qwen2Model::load`]
//! uploads in plan order, converting dtypes on the host.
//!
//! # Forward pass
//!
//! [`Qwen2Model::prefill`] and [`Qwen2Model::decode_step`] compute, per layer, what
//! transformers' Qwen2 computes (the q/k/v and gate/up projections fused, see [`Qwen2Layer`]):
//!
//! ```text
//! x = embedding(embed_tokens, ids)                                 [T, H]
//! per layer:
//!   h = rms_norm(x, input_layernorm, eps)
//!   q = linear(h, q_proj, q_bias) -> [T, Hq, D];  k, v likewise -> [T, Hkv, D]
//!   q, k = rope(q, positions), rope(k, positions)                  (theta = rope_theta)
//!   kv_cache_write_into(k, v, cache.k, cache.v, start = position)
//!   a = attention_cached_into(q, cache.k, cache.v, kv_len, 1/sqrt(D), causal)
//!   x = linear(a, o_proj, residual = x)                            (o_proj has no bias)
//!   h = rms_norm(x, post_attention_layernorm, eps)
//!   x = linear(swiglu(linear(h, gate_proj), linear(h, up_proj)), down_proj, residual = x)
//! x = rms_norm(x, norm); logits = linear(x, lm_head or embed_tokens when tied)
//! ```
//!
//! The decode step does the same for one token using only the preallocated
//! [`DecodeBuffers`] (`_into` forms of every op), with the token id, its position and the cache
//! length read from device buffers, so the whole step can be captured once as a CUDA graph and
//! replayed: between replays the host only writes those three scalars.
//!
//! # Compressed weights
//!
//! [`LoadOptions::compression`] can replace the dense projections at load: `Sparsify` prunes
//! the MLP weights to a block sparsity (an accuracy trade-off the caller asks for). Such
//! projections are read to the host in f32 and converted one layer at a time; see
//! [`crate::projection`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cubecl::prelude::*;
use ops::attention::{attention_cached_into, AttentionWorkspace, KvLen};
use ops::matmul::linear_into;
use ops::qkv::{qkv_rope_cache_into, HeadShape};
use ops::rope::RopeCache;
use ops::{caps, DType, DeviceTensor};

use crate::config::{GenerationConfig, Qwen2Config};
use crate::error::{ModelError, Result};
use crate::generate::CausalLm;
use crate::kv_cache::KvCache;
use crate::projection::{Projection, ProjectionScratch};
use crate::weights::WeightStore;

/// Context length used when neither the caller nor a smaller `max_position_embeddings` says
/// otherwise: 4096 positions of the 1.5B model's cache are 117 MB in bf16.
pub const DEFAULT_MAX_LEN: usize = 4096;

/// Picks the compute dtype.
///
/// An explicit request must be a float dtype the runtime supports (bf16 on wgpu is an error).
/// Without one: the checkpoint's dtype where the runtime supports it, else f16 (then f32) with a
/// one-line notice, e.g. a bf16 checkpoint on wgpu.
pub fn choose_dtype(
    requested: Option<DType>,
    checkpoint: DType,
    supports: impl Fn(DType) -> bool,
    runtime: &str,
) -> Result<(DType, Option<String>)> {
    if let Some(d) = requested {
        if !d.is_float() {
            return Err(ModelError::param(
                "dtype",
                format!("{d} (expected bf16, f16 or f32)"),
            ));
        }
        if !supports(d) {
            let hint = if d == DType::BF16 {
                "; use --dtype f16 or f32"
            } else {
                ""
            };
            return Err(ModelError::UnsupportedDType {
                dtype: d.to_string(),
                runtime: runtime.to_string(),
                hint: hint.to_string(),
            });
        }
        return Ok((d, None));
    }
    if supports(checkpoint) {
        return Ok((checkpoint, None));
    }
    for fallback in [DType::F16, DType::F32] {
        if supports(fallback) {
            return Ok((
                fallback,
                Some(format!(
                    "note: the checkpoint is {checkpoint}, which the {runtime} runtime cannot compute in; using {fallback} (choose with --dtype)"
                )),
            ));
        }
    }
    Err(ModelError::UnsupportedDType {
        dtype: checkpoint.to_string(),
        runtime: runtime.to_string(),
        hint: " (and neither f16 nor f32 is available)".into(),
    })
}

/// A tensor the architecture needs: its Hugging Face name and the shape `config.json` implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

/// The names and shapes of one decoder layer's tensors, in upload order.
fn layer_specs(config: &Qwen2Config, prefix: &str, i: usize) -> Vec<TensorSpec> {
    let (h, im) = (config.hidden_size, config.intermediate_size);
    let (q, kv) = (config.q_dim(), config.kv_dim());
    let p = format!("{prefix}layers.{i}.");
    let spec = |n: &str, shape: &[usize]| TensorSpec {
        name: format!("{p}{n}"),
        shape: shape.to_vec(),
    };
    vec![
        spec("input_layernorm.weight", &[h]),
        spec("self_attn.q_proj.weight", &[q, h]),
        spec("self_attn.q_proj.bias", &[q]),
        spec("self_attn.k_proj.weight", &[kv, h]),
        spec("self_attn.k_proj.bias", &[kv]),
        spec("self_attn.v_proj.weight", &[kv, h]),
        spec("self_attn.v_proj.bias", &[kv]),
        spec("self_attn.o_proj.weight", &[h, q]),
        spec("post_attention_layernorm.weight", &[h]),
        spec("mlp.gate_proj.weight", &[im, h]),
        spec("mlp.up_proj.weight", &[im, h]),
        spec("mlp.down_proj.weight", &[h, im]),
    ]
}

const LAYER_TENSORS: usize = 12;

/// What [`plan_weights`] found: the tensors to upload, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightPlan {
    /// `"model."` for `Qwen2ForCausalLM` checkpoints, `""` for headless `Qwen2Model` ones.
    pub prefix: String,
    /// embed_tokens, the layers, norm, then lm_head unless the embeddings are tied.
    pub specs: Vec<TensorSpec>,
    pub tied: bool,
    /// The dtype of the embedding table (the checkpoint's effective dtype).
    pub checkpoint_dtype: DType,
    /// Bytes of all planned tensors as stored.
    pub bytes: u64,
    /// Tensors of the checkpoint that the model does not use (rotary `inv_freq` buffers and a
    /// tied `lm_head.weight` are not listed).
    pub unused: Vec<String>,
}

/// Checks every tensor the config implies (presence, shape, dtype) on the host.
pub fn plan_weights(config: &Qwen2Config, store: &WeightStore) -> Result<WeightPlan> {
    let prefix = if store.contains("model.embed_tokens.weight") {
        "model."
    } else if store.contains("embed_tokens.weight") {
        ""
    } else {
        return Err(ModelError::MissingTensor {
            name: "model.embed_tokens.weight".into(),
            path: store.source().to_path_buf(),
        });
    };
    let (h, v) = (config.hidden_size, config.vocab_size);
    let mut specs = vec![TensorSpec {
        name: format!("{prefix}embed_tokens.weight"),
        shape: vec![v, h],
    }];
    for i in 0..config.num_hidden_layers {
        specs.extend(layer_specs(config, prefix, i));
    }
    specs.push(TensorSpec {
        name: format!("{prefix}norm.weight"),
        shape: vec![h],
    });
    let tied = config.tie_word_embeddings;
    if !tied {
        if prefix.is_empty() && !store.contains("lm_head.weight") {
            return Err(ModelError::config(
                crate::config::config_path(store.dir()),
                "tie_word_embeddings",
                "false, but this headless Qwen2Model checkpoint has no lm_head.weight to produce logits",
            ));
        }
        specs.push(TensorSpec {
            name: "lm_head.weight".into(),
            shape: vec![v, h],
        });
    }
    let mut bytes = 0u64;
    let mut checkpoint_dtype = DType::F32;
    for (i, spec) in specs.iter().enumerate() {
        let t = store.expect(&spec.name, &spec.shape)?;
        if i == 0 {
            checkpoint_dtype = t.dtype;
        }
        bytes += t.data.len() as u64;
    }
    let unused = store
        .names()
        .into_iter()
        .filter(|n| !specs.iter().any(|s| s.name == *n))
        .filter(|n| !(n.ends_with("rotary_emb.inv_freq") || (tied && *n == "lm_head.weight")))
        .map(str::to_string)
        .collect();
    Ok(WeightPlan {
        prefix: prefix.to_string(),
        specs,
        tied,
        checkpoint_dtype,
        bytes,
        unused,
    })
}

/// An uploaded tensor and the checkpoint tensors it was made of: one (`parts == [name]`), or
/// several concatenated along the first dimension (the fused QKV and gate-up projections).
pub struct Weight<R: Runtime> {
    pub name: String,
    pub parts: Vec<String>,
    pub tensor: DeviceTensor<R>,
}

impl<R: Runtime> std::fmt::Debug for Weight<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:?}", self.name, self.tensor)
    }
}

/// One decoder layer, in the compute dtype. Linear weights are `[out, in]` as in the checkpoint;
/// the projections that read the same input are concatenated at load (on the host, so nothing
/// is stored twice): one GEMV/GEMM instead of three (q, k, v) or two (gate, up).
#[derive(Debug)]
pub struct Qwen2Layer<R: Runtime> {
    pub input_layernorm: Weight<R>,
    /// `[Hq·D + 2·Hkv·D, H]`: q_proj, k_proj, v_proj rows, with the three biases.
    pub qkv_proj: Projection<R>,
    pub o_proj: Projection<R>,
    pub post_attention_layernorm: Weight<R>,
    /// `[2·I, H]`: gate_proj rows, then up_proj rows.
    pub gate_up_proj: Projection<R>,
    pub down_proj: Projection<R>,
}

/// Which projections of the model [`Compression`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Attention,
    Mlp,
    LmHead,
}

/// How the linear projections are stored on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Compression {
    /// Dense, in the compute dtype (the fused kernels).
    #[default]
    None,
    /// Prune the MLP weights (gate, up, down) to this fraction of zero blocks (by block L2
    /// norm, 32x32 blocks where the shapes allow, else 16x16) and run them block-sparse. This
    /// changes the model's outputs: an accuracy-for-speed trade-off.
    Sparsify { sparsity: f64 },
    /// Quantize every linear projection (q/k/v, o, gate/up, down; not the embeddings or the
    /// norms) at load, and the LM head too when `lm_head` is set (a tied head gets its own
    /// quantized copy; the embedding table stays float).
    Quant { mode: QuantMode, lm_head: bool },
}

/// The quantized weight formats of [`Compression::Quant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    /// int8 weights per output channel, int8 activations per token, i32 accumulation.
    W8A8,
    /// fp8 e4m3 weights and activations with the same scaling, f32 accumulation.
    Fp8,
    /// int4 weights with float activations (dequantized in registers).
    W4A16 { group: Int4Group },
}

/// Where the scales of int4 weights change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Int4Group {
    /// Per group of 128 input features where K allows, else 64, else 32, else per channel
    /// (group-wise because per-channel int4 loses too much on real models).
    #[default]
    Auto,
    /// One scale per output channel.
    PerChannel,
    /// Groups of this many input features (K must be a multiple).
    Size(usize),
}

impl Int4Group {
    /// The group size for an input dimension `k` (`None`: per channel).
    fn for_k(self, k: usize) -> Option<usize> {
        match self {
            Self::Auto => [128, 64, 32].into_iter().find(|g| k.is_multiple_of(*g)),
            Self::PerChannel => None,
            Self::Size(g) => Some(g),
        }
    }
}

impl QuantMode {
    pub fn name(self) -> String {
        match self {
            Self::W8A8 => "w8a8".into(),
            Self::Fp8 => "fp8".into(),
            Self::W4A16 { group } => match group {
                Int4Group::Auto => "w4a16 (group 128 where K allows)".into(),
                Int4Group::PerChannel => "w4a16 (per channel)".into(),
                Int4Group::Size(g) => format!("w4a16 (group {g})"),
            },
        }
    }
}

impl Compression {
    fn applies_to(&self, slot: Slot) -> bool {
        match self {
            Self::None => false,
            Self::Sparsify { .. } => slot == Slot::Mlp,
            Self::Quant { lm_head, .. } => slot != Slot::LmHead || *lm_head,
        }
    }

    fn check(&self) -> Result<()> {
        match *self {
            Self::None | Self::Quant { .. } => Ok(()),
            Self::Sparsify { sparsity } if (0.0..1.0).contains(&sparsity) => Ok(()),
            Self::Sparsify { sparsity } => Err(ModelError::param(
                "sparsify",
                format!("the block sparsity must be in [0, 1), got {sparsity}"),
            )),
        }
    }

    /// Builds the compressed layer of a host weight `[n, k]` (f32) and its optional bias.
    fn build<R: Runtime>(
        &self,
        client: &ComputeClient<R>,
        w: &HostWeight,
        bias: Option<&HostWeight>,
        dtype: DType,
    ) -> Result<BuiltLayer<R>> {
        let [n, k] = w.shape[..] else {
            unreachable!("projections are matrices (checked by plan_weights)")
        };
        let bias = match bias {
            Some(b) => Some(DeviceTensor::from_f32(client, &b.data, &[n], dtype)?),
            None => None,
        };
        let layer: Box<dyn ops::linear::Linear<R>> = match *self {
            Self::None => unreachable!("dense projections are not built here"),
            Self::Sparsify { sparsity } => {
                let block = [32, 16]
                    .into_iter()
                    .find(|b| n % b == 0 && k % b == 0)
                    .ok_or_else(|| {
                        ModelError::param(
                            "sparsify",
                            format!(
                                "{} is [{n}, {k}]: block sparsity needs both dimensions to be \
                                 multiples of 16",
                                w.parts.join(" + ")
                            ),
                        )
                    })?;
                Box::new(sparse::SparseLinear::prune(
                    client,
                    &w.data,
                    [n, k],
                    block,
                    sparsity,
                    dtype,
                )?)
            }
            Self::Quant { mode, .. } => match mode {
                QuantMode::W8A8 => Box::new(quant::W8A8Linear::from_dense(
                    client,
                    &w.data,
                    [n, k],
                    dtype,
                )?),
                QuantMode::Fp8 => Box::new(quant::Fp8Linear::from_dense(
                    client,
                    &w.data,
                    [n, k],
                    dtype,
                )?),
                QuantMode::W4A16 { group } => Box::new(quant::W4A16Linear::from_dense(
                    client,
                    &w.data,
                    [n, k],
                    dtype,
                    group.for_k(k),
                )?),
            },
        };
        Ok((layer, bias))
    }
}

/// A compressed layer and its bias.
type BuiltLayer<R> = (Box<dyn ops::linear::Linear<R>>, Option<DeviceTensor<R>>);

/// A checkpoint tensor (or fused group) read to the host in f32, to be compressed.
struct HostWeight {
    parts: Vec<String>,
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// One upload group: on the device as it is, or on the host for compression.
enum Upload<R: Runtime> {
    Dense(Weight<R>),
    Host(HostWeight),
}

impl<R: Runtime> Upload<R> {
    fn dense(self) -> Weight<R> {
        match self {
            Self::Dense(w) => w,
            Self::Host(_) => unreachable!("norms and embeddings are always uploaded"),
        }
    }
}

/// How the checkpoint's tensors of one layer (plan order, see [`layer_specs`]) are grouped into
/// uploads: indices into the layer's 12 specs.
const LAYER_UPLOADS: [&[usize]; 7] = [&[0], &[1, 3, 5], &[2, 4, 6], &[7], &[8], &[9, 10], &[11]];

/// Options of [`Qwen2Model::load`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOptions {
    /// Compute dtype; `None` picks one with [`choose_dtype`].
    pub dtype: Option<DType>,
    /// Context length (KV cache positions); `None`: `min(max_position_embeddings, 4096)`.
    pub max_len: Option<usize>,
    /// How the projections are stored (dense unless asked otherwise).
    pub compression: Compression,
}

/// Reported after each tensor is uploaded.
#[derive(Debug, Clone, Copy)]
pub struct LoadProgress<'a> {
    pub tensor: &'a str,
    /// 1-based index of this tensor.
    pub index: usize,
    pub count: usize,
    /// Checkpoint bytes uploaded so far, and in all.
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What loading decided and found.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadReport {
    pub dtype: DType,
    pub checkpoint_dtype: DType,
    pub max_len: usize,
    /// One-line notices for the user (dtype fallback, unused tensors, ...).
    pub notices: Vec<String>,
    pub bytes: u64,
    /// Device bytes of all weights as loaded, and what they would be dense in the compute
    /// dtype (equal without compression).
    pub weight_bytes: u64,
    pub dense_weight_bytes: u64,
    pub elapsed: Duration,
}

/// A loaded Qwen2 model.
pub struct Qwen2Model<R: Runtime> {
    client: ComputeClient<R>,
    config: Qwen2Config,
    generation: GenerationConfig,
    dir: PathBuf,
    dtype: DType,
    max_len: usize,
    pub embed_tokens: Weight<R>,
    pub layers: Vec<Qwen2Layer<R>>,
    pub norm: Weight<R>,
    /// `None` when the embeddings are tied (the logits use `embed_tokens`), unless the head is
    /// compressed: then its own compressed copy.
    pub lm_head: Option<Projection<R>>,
    /// RoPE cos/sin for every position below `max_len`.
    pub rope: RopeCache<R>,
}

impl<R: Runtime> std::fmt::Debug for Qwen2Model<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Qwen2Model {{ dir: {}, layers: {}, dtype: {}, max_len: {} }}",
            self.dir.display(),
            self.layers.len(),
            self.dtype,
            self.max_len
        )
    }
}

impl<R: Runtime> Qwen2Model<R> {
    /// Loads `config.json`, `generation_config.json` and the safetensors weights of `dir` and
    /// uploads the weights in the chosen dtype. `progress` is called after every tensor.
    pub fn load(
        client: &ComputeClient<R>,
        dir: &Path,
        options: &LoadOptions,
        progress: &mut dyn FnMut(&LoadProgress),
    ) -> Result<(Self, LoadReport)> {
        let start = Instant::now();
        if !dir.is_dir() {
            return Err(ModelError::io(dir, "no such model directory"));
        }
        let config = Qwen2Config::from_dir(dir)?;
        let generation = GenerationConfig::from_dir(dir)?;
        let store = WeightStore::open(dir)?;
        let plan = plan_weights(&config, &store)?;

        let runtime = caps::runtime_name(client);
        let (dtype, notice) = choose_dtype(
            options.dtype,
            plan.checkpoint_dtype,
            |d| caps::supports_dtype(client, d),
            runtime,
        )?;
        let mut notices: Vec<String> = notice.into_iter().collect();

        let max_len = options
            .max_len
            .unwrap_or_else(|| config.max_position_embeddings.min(DEFAULT_MAX_LEN));
        if max_len == 0 {
            return Err(ModelError::param("max_len", "must be positive"));
        }
        if max_len > config.max_position_embeddings {
            notices.push(format!(
                "note: context {max_len} exceeds max_position_embeddings {} of config.json",
                config.max_position_embeddings
            ));
        }
        config.check_context(max_len, &crate::config::config_path(dir))?;
        if !plan.unused.is_empty() {
            let shown: Vec<&str> = plan.unused.iter().take(3).map(String::as_str).collect();
            notices.push(format!(
                "note: {} tensors of the checkpoint are not used ({}{})",
                plan.unused.len(),
                shown.join(", "),
                if plan.unused.len() > 3 { ", ..." } else { "" }
            ));
        }

        let compression = options.compression;
        compression.check()?;
        // Uploads: embed_tokens, per layer the groups of LAYER_UPLOADS, norm, lm_head. Groups
        // that are compressed are read to the host in f32 instead and converted as soon as the
        // projection is complete, so at most one projection is on the host at a time.
        let layers_n = config.num_hidden_layers;
        let mut groups: Vec<Vec<usize>> = vec![vec![0]];
        for l in 0..layers_n {
            for g in LAYER_UPLOADS {
                groups.push(g.iter().map(|i| 1 + l * LAYER_TENSORS + i).collect());
            }
        }
        let tail = 1 + layers_n * LAYER_TENSORS;
        groups.extend((tail..plan.specs.len()).map(|i| vec![i]));
        let count = groups.len();
        let mut done = 0u64;
        let mut read = |i: usize, host: bool| -> Result<Upload<R>> {
            let group = &groups[i];
            let to = if host { DType::F32 } else { dtype };
            let mut bytes = Vec::new();
            let mut rows = 0usize;
            let mut parts = Vec::new();
            for &si in group {
                let spec = &plan.specs[si];
                let t = store.get(&spec.name)?;
                bytes.extend_from_slice(&t.bytes_as(to)?);
                rows += spec.shape[0];
                done += t.data.len() as u64;
                parts.push(spec.name.clone());
            }
            let mut shape = plan.specs[group[0]].shape.clone();
            shape[0] = rows;
            let name = parts.join(" + ");
            progress(&LoadProgress {
                tensor: &name,
                index: i + 1,
                count,
                bytes_done: done,
                bytes_total: plan.bytes,
            });
            if host {
                let data = bytemuck::pod_collect_to_vec(&bytes);
                return Ok(Upload::Host(HostWeight { parts, shape, data }));
            }
            let tensor = DeviceTensor::from_bytes(client, &bytes, &shape, dtype)?;
            Ok(Upload::Dense(Weight {
                name,
                parts,
                tensor,
            }))
        };
        let projection = |w: Upload<R>, bias: Option<Upload<R>>| -> Result<Projection<R>> {
            Ok(match (w, bias) {
                (Upload::Dense(weight), bias) => Projection::Dense {
                    weight,
                    bias: bias.map(Upload::dense),
                },
                (Upload::Host(w), bias) => {
                    let bias = bias.map(|b| match b {
                        Upload::Host(b) => b,
                        Upload::Dense(_) => unreachable!("a bias is read like its weight"),
                    });
                    let (layer, bias) = compression.build(client, &w, bias.as_ref(), dtype)?;
                    Projection::Compressed {
                        parts: w.parts,
                        layer,
                        bias,
                    }
                }
            })
        };
        let attn = compression.applies_to(Slot::Attention);
        let mlp = compression.applies_to(Slot::Mlp);
        // A tied LM head that is compressed: its own copy from the embedding table, built while
        // the table is on the host (then the table is uploaded dense for the lookups).
        let (embed_tokens, tied_head) = if plan.tied && compression.applies_to(Slot::LmHead) {
            let Upload::Host(table) = read(0, true)? else {
                unreachable!("read to the host")
            };
            let tensor = DeviceTensor::from_f32(client, &table.data, &table.shape, dtype)?;
            let embed = Weight {
                name: table.parts.join(" + "),
                parts: table.parts.clone(),
                tensor,
            };
            (embed, Some(projection(Upload::Host(table), None)?))
        } else {
            (read(0, false)?.dense(), None)
        };
        let mut layers = Vec::with_capacity(layers_n);
        for l in 0..layers_n {
            let g = 1 + l * LAYER_UPLOADS.len();
            let input_layernorm = read(g, false)?.dense();
            let (qkv, qkv_bias) = (read(g + 1, attn)?, read(g + 2, attn)?);
            layers.push(Qwen2Layer {
                input_layernorm,
                qkv_proj: projection(qkv, Some(qkv_bias))?,
                o_proj: projection(read(g + 3, attn)?, None)?,
                post_attention_layernorm: read(g + 4, false)?.dense(),
                gate_up_proj: projection(read(g + 5, mlp)?, None)?,
                down_proj: projection(read(g + 6, mlp)?, None)?,
            });
        }
        let g = 1 + layers_n * LAYER_UPLOADS.len();
        let norm = read(g, false)?.dense();
        let lm_head = if plan.tied {
            tied_head
        } else {
            let head = read(g + 1, compression.applies_to(Slot::LmHead))?;
            Some(projection(head, None)?)
        };
        let rope = RopeCache::new(client, max_len, config.head_dim, config.rope_theta)?;

        let dense_weight_bytes = plan
            .specs
            .iter()
            .map(|s| (s.shape.iter().product::<usize>() * dtype.size()) as u64)
            .sum();
        let mut report = LoadReport {
            dtype,
            checkpoint_dtype: plan.checkpoint_dtype,
            max_len,
            notices,
            bytes: plan.bytes,
            weight_bytes: 0,
            dense_weight_bytes,
            elapsed: start.elapsed(),
        };
        let model = Self {
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
        };
        report.weight_bytes = model.weight_bytes();
        Ok((model, report))
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
        (dense + compressed) as u64
    }

    /// Every projection: per layer qkv, o, gate-up, down; then an untied lm_head.
    pub fn projections(&self) -> impl Iterator<Item = &Projection<R>> {
        self.layers
            .iter()
            .flat_map(|l| [&l.qkv_proj, &l.o_proj, &l.gate_up_proj, &l.down_proj])
            .chain(self.lm_head.as_ref())
    }

    pub fn client(&self) -> &ComputeClient<R> {
        &self.client
    }

    pub fn config(&self) -> &Qwen2Config {
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

    pub fn rope_theta(&self) -> f64 {
        self.config.rope_theta
    }

    pub fn rms_norm_eps(&self) -> f64 {
        self.config.rms_norm_eps
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
                let table = &self.embed_tokens.tensor;
                linear_into(&self.client, x, table, None, None, out)?;
                Ok(())
            }
        }
    }

    /// Every dense upload (compressed projections are not listed), in upload order.
    pub fn weights(&self) -> Vec<&Weight<R>> {
        let mut all = vec![&self.embed_tokens];
        for l in &self.layers {
            all.push(&l.input_layernorm);
            all.extend(l.qkv_proj.dense_weights());
            all.extend(l.o_proj.dense_weights());
            all.push(&l.post_attention_layernorm);
            all.extend(l.gate_up_proj.dense_weights());
            all.extend(l.down_proj.dense_weights());
        }
        all.push(&self.norm);
        all.extend(self.lm_head.iter().flat_map(Projection::dense_weights));
        all
    }

    /// A KV cache of `max_len` positions in the compute dtype.
    pub fn new_cache(&self) -> Result<KvCache<R>> {
        KvCache::for_config(&self.client, &self.config, self.max_len, self.dtype)
    }

    /// The preallocated buffers of the decode step.
    pub fn new_decode_buffers(&self) -> Result<DecodeBuffers<R>> {
        DecodeBuffers::new(&self.client, &self.config, self.dtype, self.max_len)
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
        cache.check_room(tokens.len())?;
        if cache.dtype() != self.dtype {
            return Err(ModelError::param(
                "prefill",
                format!(
                    "cache is {}, the model computes in {}",
                    cache.dtype(),
                    self.dtype
                ),
            ));
        }
        let c = &self.client;
        let (t, pos0) = (tokens.len(), cache.len());
        let (hq, d) = (self.config.num_attention_heads, self.config.head_dim);
        let eps = self.config.rms_norm_eps as f32;
        let ids = DeviceTensor::from_slice(c, tokens, &[t])?;
        let start = DeviceTensor::from_slice(c, &[pos0 as u32], &[1])?;
        let q = DeviceTensor::empty(c, &[t, hq, d], self.dtype);
        let attn = DeviceTensor::empty(c, &[t, hq, d], self.dtype);
        let attn_flat = attn.reshape(&[t, hq * d])?;
        let gate = DeviceTensor::empty(c, &[t, self.config.intermediate_size], self.dtype);
        let mut x = ops::embedding::embedding(c, &self.embed_tokens.tensor, &ids)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let lc = cache.layer(l);
            let h = ops::norm::rms_norm(c, &x, &layer.input_layernorm.tensor, eps)?;
            let qkv = layer.qkv_proj.forward(c, &h, None)?;
            qkv_rope_cache_into(
                c,
                &qkv,
                self.heads(),
                &self.rope.cos,
                &self.rope.sin,
                &start,
                &q,
                &lc.k,
                &lc.v,
                None,
            )?;
            attention_cached_into(
                c,
                &q,
                &lc.k,
                &lc.v,
                KvLen::Host(pos0 + t),
                self.scale(),
                &attn,
                None,
            )?;
            x = layer.o_proj.forward(c, &attn_flat, Some(&x))?;
            let h = ops::norm::rms_norm(c, &x, &layer.post_attention_layernorm.tensor, eps)?;
            layer.gate_up_proj.gated_mlp_into(c, &h, &gate, None)?;
            x = layer.down_proj.forward(c, &gate, Some(&x))?;
        }
        if logits == Logits::Last && t > 1 {
            // Only the last row reaches the LM head: gather it (the embedding kernel is a gather).
            let last = DeviceTensor::from_slice(c, &[(t - 1) as u32], &[1])?;
            x = ops::embedding::embedding(c, &x, &last)?;
        }
        let xn = ops::norm::rms_norm(c, &x, &self.norm.tensor, eps)?;
        let rows = xn.shape()[0];
        let out = DeviceTensor::empty(c, &[rows, self.config.vocab_size], self.dtype);
        self.logits_into(&xn, &out, None)?;
        cache.advance(t)?;
        cache.sync_len(c)?;
        Ok(out)
    }

    fn heads(&self) -> HeadShape {
        HeadShape {
            q_heads: self.config.num_attention_heads,
            kv_heads: self.config.num_key_value_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// The attention scale `1 / sqrt(head_dim)`.
    fn scale(&self) -> f32 {
        1.0 / (self.config.head_dim as f32).sqrt()
    }

    /// One decode step, allocation-free and graph-capturable: reads the token id, its position
    /// and the cache length from `step`'s device buffers (written beforehand with
    /// [`DecodeBuffers::write_inputs`]), writes the token's keys and values at `position` in
    /// `cache`, and leaves the logits in `step.logits`. The caller advances the cache's host
    /// length afterwards ([`KvCache::advance`]); the device length lives in `step.kv_len`.
    pub fn decode_step(&self, cache: &KvCache<R>, step: &DecodeBuffers<R>) -> Result<()> {
        if cache.dtype() != self.dtype || step.dtype != self.dtype {
            return Err(ModelError::param(
                "decode_step",
                format!(
                    "cache is {} and buffers are {}, the model computes in {}",
                    cache.dtype(),
                    step.dtype,
                    self.dtype
                ),
            ));
        }
        cache.check_room(1)?;
        let c = &self.client;
        let eps = self.config.rms_norm_eps as f32;
        ops::embedding::embedding_into(c, &self.embed_tokens.tensor, &step.token, &step.hidden)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let lc = cache.layer(l);
            ops::norm::rms_norm_into(
                c,
                &step.hidden,
                &layer.input_layernorm.tensor,
                eps,
                &step.normed,
            )?;
            let scratch = Some(&step.scratch);
            layer
                .qkv_proj
                .forward_into(c, &step.normed, None, &step.qkv, scratch)?;
            qkv_rope_cache_into(
                c,
                &step.qkv,
                self.heads(),
                &self.rope.cos,
                &self.rope.sin,
                &step.position,
                &step.q,
                &lc.k,
                &lc.v,
                None,
            )?;
            let len = KvLen::Device(&step.kv_len);
            attention_cached_into(
                c,
                &step.q,
                &lc.k,
                &lc.v,
                len,
                self.scale(),
                &step.attn,
                Some(&step.workspace),
            )?;
            // The residual stream ping-pongs between `hidden` and `hidden2`: an output may not
            // alias an input of the same launch (WebGPU forbids it).
            layer.o_proj.forward_into(
                c,
                &step.attn_flat,
                Some(&step.hidden),
                &step.hidden2,
                scratch,
            )?;
            ops::norm::rms_norm_into(
                c,
                &step.hidden2,
                &layer.post_attention_layernorm.tensor,
                eps,
                &step.normed,
            )?;
            layer
                .gate_up_proj
                .gated_mlp_into(c, &step.normed, &step.gate, scratch)?;
            layer.down_proj.forward_into(
                c,
                &step.gate,
                Some(&step.hidden2),
                &step.hidden,
                scratch,
            )?;
        }
        ops::norm::rms_norm_into(c, &step.hidden, &self.norm.tensor, eps, &step.normed)?;
        self.logits_into(&step.normed, &step.logits, Some(&step.scratch))?;
        ops::argmax::argmax_into(c, &step.logits, &step.next_token)?;
        Ok(())
    }
}

/// Which logits [`Qwen2Model::prefill`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// The last position's (what generation needs).
    Last,
    /// Every position's (what the comparison with transformers needs).
    All,
}

/// Everything one decode step reads and writes besides the weights and the KV cache,
/// allocated once so the step allocates nothing and can be captured as a CUDA graph.
///
/// | buffer | shape | dtype | role |
/// |---|---|---|---|
/// | `token` | `[1]` | u32 | the input token id (host-written, or the previous step's `next_token`) |
/// | `position` | `[1]` | u32 | its position = cache length before the step (RoPE row, KV write row) |
/// | `kv_len` | `[1]` | u32 | cache length after the step = `position + 1` (attention length) |
/// | `hidden`, `hidden2` | `[1, H]` | compute | residual stream (ping-pong) |
/// | `normed` | `[1, H]` | compute | RMSNorm output fed to the projections |
/// | `qkv` | `[1, (Hq + 2 Hkv) D]` | compute | fused q/k/v projection with biases |
/// | `q` | `[1, Hq, D]` | compute | query after RoPE (k and v go straight to the cache) |
/// | `attn` (`attn_flat`) | `[1, Hq, D]` (`[1, Hq D]`) | compute | attention output |
/// | `gate` | `[1, I]` | compute | `silu(gate) * up` from the fused MLP kernel |
/// | `logits` | `[1, V]` | compute | output of the LM head |
/// | `next_token` | `[1]` | u32 | device argmax of `logits` (greedy without reading the logits) |
/// | `workspace` | | f32 | split-KV attention partials, sized for the cache's capacity |
pub struct DecodeBuffers<R: Runtime> {
    pub dtype: DType,
    pub token: DeviceTensor<R>,
    pub position: DeviceTensor<R>,
    pub kv_len: DeviceTensor<R>,
    pub hidden: DeviceTensor<R>,
    pub hidden2: DeviceTensor<R>,
    pub normed: DeviceTensor<R>,
    pub qkv: DeviceTensor<R>,
    pub q: DeviceTensor<R>,
    pub attn: DeviceTensor<R>,
    pub attn_flat: DeviceTensor<R>,
    pub gate: DeviceTensor<R>,
    pub logits: DeviceTensor<R>,
    pub next_token: DeviceTensor<R>,
    pub workspace: AttentionWorkspace<R>,
    /// Intermediates of compressed projections (unused by dense ones).
    pub scratch: ProjectionScratch<R>,
}

impl<R: Runtime> DecodeBuffers<R> {
    pub fn new(
        client: &ComputeClient<R>,
        config: &Qwen2Config,
        dtype: DType,
        max_len: usize,
    ) -> Result<Self> {
        let (h, i, v) = (
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
        );
        let (hq, hkv, d) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        );
        let scalar = || DeviceTensor::from_slice(client, &[0u32], &[1]);
        let attn = DeviceTensor::empty(client, &[1, hq, d], dtype);
        Ok(Self {
            dtype,
            token: scalar()?,
            position: scalar()?,
            kv_len: scalar()?,
            hidden: DeviceTensor::empty(client, &[1, h], dtype),
            hidden2: DeviceTensor::empty(client, &[1, h], dtype),
            normed: DeviceTensor::empty(client, &[1, h], dtype),
            qkv: DeviceTensor::empty(client, &[1, (hq + 2 * hkv) * d], dtype),
            q: DeviceTensor::empty(client, &[1, hq, d], dtype),
            attn_flat: attn.reshape(&[1, hq * d])?,
            attn,
            gate: DeviceTensor::empty(client, &[1, i], dtype),
            logits: DeviceTensor::empty(client, &[1, v], dtype),
            next_token: scalar()?,
            workspace: AttentionWorkspace::for_shapes(client, 1, hq, hkv, d, max_len),
            scratch: ProjectionScratch::new(client, config, dtype),
        })
    }

    /// Writes the step's scalars (host to device, outside any capture window).
    pub fn write_inputs(
        &self,
        client: &ComputeClient<R>,
        token: u32,
        position: usize,
    ) -> Result<()> {
        let position = u32::try_from(position).map_err(|_| {
            ModelError::param("position", format!("{position} does not fit in u32"))
        })?;
        self.token.write_bytes(client, &token.to_le_bytes())?;
        self.position.write_bytes(client, &position.to_le_bytes())?;
        self.kv_len
            .write_bytes(client, &(position + 1).to_le_bytes())?;
        Ok(())
    }
}

/// Where the current logits are.
enum Current<R: Runtime> {
    None,
    Prefill(DeviceTensor<R>),
    Decode,
}

/// Whether decode steps replay a captured CUDA graph.
enum GraphState<R: Runtime> {
    /// Eager launches (runtimes without hardware graphs, or `CUBELLM_NO_GRAPH=1`, or a capture
    /// that failed).
    Off,
    /// The first step runs eagerly (it compiles the kernels); the second is captured.
    Warming {
        steps: usize,
    },
    Ready(cubecl::client::Graph<R>),
}

/// A model with its KV cache and decode buffers: what [`crate::Generator`] drives.
///
/// On CUDA the decode step is captured once as a graph (after a first eager step has compiled
/// every kernel) and replayed for every later token: the host then only writes the step's three
/// scalars and launches one graph instead of ~9 kernels per layer. The graph reads the same
/// buffers every time (the decode buffers, the cache, the weights), all owned by the session,
/// so they outlive it.
pub struct Qwen2Session<R: Runtime> {
    model: Qwen2Model<R>,
    cache: KvCache<R>,
    step: DecodeBuffers<R>,
    current: Current<R>,
    graph: GraphState<R>,
}

impl<R: Runtime> Qwen2Session<R> {
    pub fn new(model: Qwen2Model<R>) -> Result<Self> {
        let cache = model.new_cache()?;
        let step = model.new_decode_buffers()?;
        // Block-sparse projections run eagerly (see `Projection::graph_safe`).
        let graph_safe = model.projections().all(Projection::graph_safe);
        let graphs = caps::runtime_name(&model.client) == "cuda"
            && graph_safe
            && std::env::var("CUBELLM_NO_GRAPH").map_or(true, |v| v.is_empty() || v == "0");
        Ok(Self {
            model,
            cache,
            step,
            current: Current::None,
            graph: if graphs {
                GraphState::Warming { steps: 0 }
            } else {
                GraphState::Off
            },
        })
    }

    /// Whether decode steps currently replay a captured graph.
    pub fn uses_graph(&self) -> bool {
        matches!(self.graph, GraphState::Ready(_))
    }

    /// Runs the decode step whose inputs were just written: eagerly, by capturing it, or by
    /// replaying the capture.
    fn run_step(&mut self) -> Result<()> {
        let c = self.model.client.clone();
        match &mut self.graph {
            GraphState::Off => self.model.decode_step(&self.cache, &self.step),
            GraphState::Ready(graph) => {
                // SAFETY: the graph reads and writes only buffers owned by this session (weights,
                // cache, decode buffers), which live as long as the graph, and everything runs
                // on the one client's stream.
                unsafe { graph.replay() };
                Ok(())
            }
            GraphState::Warming { steps } if *steps == 0 => {
                *steps += 1;
                self.model.decode_step(&self.cache, &self.step)
            }
            GraphState::Warming { .. } => {
                // Prepare, run the step for real (its results are this token's), then record the
                // same launches for the following tokens. A failure falls back to eager steps.
                c.graph_prepare()
                    .map_err(|e| ModelError::param("graph", format!("{e:?}")))?;
                self.model.decode_step(&self.cache, &self.step)?;
                let captured = c.start_capture().and_then(|_| {
                    let recorded = self.model.decode_step(&self.cache, &self.step);
                    let graph = c.stop_capture();
                    match recorded {
                        Ok(()) => graph,
                        Err(e) => Err(cubecl::server::ServerError::Generic {
                            reason: e.to_string(),
                            backtrace: Default::default(),
                        }),
                    }
                });
                self.graph = match captured {
                    Ok(graph) => GraphState::Ready(graph),
                    Err(e) => {
                        eprintln!("note: CUDA graph capture of the decode step failed ({e:?}); decoding eagerly");
                        GraphState::Off
                    }
                };
                Ok(())
            }
        }
    }

    pub fn model(&self) -> &Qwen2Model<R> {
        &self.model
    }

    pub fn cache(&self) -> &KvCache<R> {
        &self.cache
    }

    pub fn into_model(self) -> Qwen2Model<R> {
        self.model
    }

    /// Prefill returning every position's logits (for comparisons with a reference).
    pub fn prefill_all_logits(&mut self, tokens: &[u32]) -> Result<DeviceTensor<R>> {
        let logits = self.model.prefill(tokens, &mut self.cache, Logits::All)?;
        self.current = Current::None;
        Ok(logits)
    }
}

impl<R: Runtime> CausalLm for Qwen2Session<R> {
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn max_len(&self) -> usize {
        self.cache.max_len()
    }

    fn len(&self) -> usize {
        self.cache.len()
    }

    fn reset(&mut self) -> Result<()> {
        self.current = Current::None;
        self.cache.reset(&self.model.client)
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<()> {
        let logits = self.model.prefill(tokens, &mut self.cache, Logits::Last)?;
        self.current = Current::Prefill(logits);
        Ok(())
    }

    fn decode(&mut self, token: u32) -> Result<()> {
        if token as usize >= self.model.config.vocab_size {
            return Err(ModelError::param(
                "token",
                format!(
                    "{token} is outside the vocabulary of {}",
                    self.model.config.vocab_size
                ),
            ));
        }
        self.cache.check_room(1)?;
        self.step
            .write_inputs(&self.model.client, token, self.cache.len())?;
        self.run_step()?;
        self.cache.advance(1)?;
        self.current = Current::Decode;
        Ok(())
    }

    fn argmax(&mut self) -> Result<u32> {
        let c = &self.model.client;
        let ids = match &self.current {
            // The decode step already ran the device argmax: read back one u32.
            Current::Decode => self.step.next_token.to_vec::<u32>(c)?,
            Current::Prefill(t) => ops::argmax::argmax(c, t)?.to_vec::<u32>(c)?,
            Current::None => {
                return Err(ModelError::param("argmax", "no forward pass has run yet"))
            }
        };
        ids.last().copied().ok_or(ModelError::BadLogits {
            step: self.cache.len(),
            detail: "empty logits".into(),
        })
    }

    fn logits(&mut self, out: &mut Vec<f32>) -> Result<()> {
        let tensor = match &self.current {
            Current::Prefill(t) => t,
            Current::Decode => &self.step.logits,
            Current::None => {
                return Err(ModelError::param("logits", "no forward pass has run yet"))
            }
        };
        *out = tensor.to_f32_vec(&self.model.client)?;
        Ok(())
    }
}
