//! Loading: `config.json` → the family's [`ModelConfig`], the host-side plan of every tensor
//! ([`plan_weights`]), the compute dtype ([`choose_dtype`]), then the uploads in plan order,
//! converting dtypes on the host and building compressed projections ([`Compression`]) one at a
//! time.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use cubecl::prelude::*;
use ops::rope::RopeCache;
use ops::{caps, DType, DeviceTensor};

use crate::config::{GenerationConfig, ModelConfig};
use crate::engine::compression::{Compression, HostWeight, Slot};
use crate::engine::memory::{DeviceMemory, MemoryPlan};
use crate::engine::model::Model;
use crate::engine::plan::{plan_weights, Target, WeightPlan};
use crate::engine::projection::{Projection, Weight};
use crate::error::{ModelError, Result};
use crate::models::decoder::{DecoderLayer, LayerParts, Role};
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

/// Device bytes of the planned weights as they will be stored, in all and the largest tensor.
fn planned_weight_bytes(plan: &WeightPlan, dtype: DType, compression: Compression) -> (u64, u64) {
    let mut total = 0u64;
    let mut largest = 0u64;
    let mut add = |n: u64| {
        total += n;
        largest = largest.max(n);
    };
    for upload in &plan.uploads {
        let numel = upload.shape().iter().product::<usize>() as u64;
        let dense = numel * dtype.size() as u64;
        let slot = match upload.target {
            Target::Layer(_, role) => Slot::of(role),
            Target::LmHead => Some(Slot::LmHead),
            Target::Embedding | Target::FinalNorm => None,
        };
        match slot {
            Some(s) if compression.applies_to(s) => add(compression.stored_bytes(numel, dtype)),
            _ => add(dense),
        }
        // A tied head that is compressed gets its own copy of the table.
        if upload.target == Target::Embedding && plan.tied && compression.applies_to(Slot::LmHead) {
            add(compression.stored_bytes(numel, dtype));
        }
    }
    (total, largest)
}

/// Options of [`Model::load`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadOptions {
    /// Compute dtype; `None` picks one with [`choose_dtype`].
    pub dtype: Option<DType>,
    /// Context length (KV cache positions); `None`: `min(max_position_embeddings, 4096)`.
    pub max_len: Option<usize>,
    /// How the projections are stored (dense unless asked otherwise).
    pub compression: Compression,
    /// Greedy decoding screens the float LM head with an int8 copy of it (built at load, one
    /// byte a weight more on the device) and computes again from the float head only the rows
    /// that can be the argmax: the same tokens, about half the head's bytes a step. Errors on
    /// a quantized head or a hidden size that is not a multiple of 16.
    pub screen_lm_head: bool,
    /// Bytes free on the device, for the check of the model and its context before anything is
    /// allocated (CubeCL does not report it; the CLI asks the driver). `None`: only the
    /// runtime's limit on one allocation is checked.
    pub device_free_bytes: Option<u64>,
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

/// One upload: on the device as it is, or on the host for compression.
enum Upload<R: Runtime> {
    Dense(Weight<R>),
    Host(HostWeight),
}

impl<R: Runtime> Upload<R> {
    fn dense(self) -> Weight<R> {
        match self {
            Self::Dense(w) => w,
            Self::Host(_) => unreachable!("norms and embeddings are read to the device"),
        }
    }
}

/// Reads the plan's uploads from the checkpoint, reporting progress.
struct Reader<'a, R: Runtime> {
    client: &'a ComputeClient<R>,
    store: &'a WeightStore,
    plan: &'a WeightPlan,
    dtype: DType,
    compression: Compression,
    done: u64,
    progress: &'a mut dyn FnMut(&LoadProgress),
}

impl<R: Runtime> Reader<'_, R> {
    /// Upload `i` of the plan, concatenated, on the device in the compute dtype or (`host`) in
    /// f32 on the host.
    fn read(&mut self, i: usize, host: bool) -> Result<Upload<R>> {
        let upload = &self.plan.uploads[i];
        let to = self.dtype;
        let numel: usize = upload.shape().iter().product();
        let mut bytes = Vec::with_capacity(if host { 0 } else { numel * to.size() });
        let mut values = Vec::with_capacity(if host { numel } else { 0 });
        let mut parts = Vec::new();
        for spec in &upload.parts {
            let t = self.store.get(&spec.name)?;
            if host {
                // Straight to f32 (the compression's input), one pass over the file's bytes.
                t.append_f32(&mut values)?;
            } else if t.dtype == to {
                // Without a conversion the file's bytes go straight into the upload buffer (one
                // copy, as when the file was mapped).
                t.read_append(&mut bytes)?;
            } else {
                bytes.extend_from_slice(&t.bytes_as(to)?);
            }
            self.done += t.byte_len() as u64;
            parts.push(spec.name.clone());
        }
        let shape = upload.shape();
        let name = upload.name();
        (self.progress)(&LoadProgress {
            tensor: &name,
            index: i + 1,
            count: self.plan.uploads.len(),
            bytes_done: self.done,
            bytes_total: self.plan.bytes,
        });
        if host {
            let data = values;
            return Ok(Upload::Host(HostWeight { parts, shape, data }));
        }
        let tensor = DeviceTensor::from_bytes(self.client, &bytes, &shape, self.dtype)?;
        Ok(Upload::Dense(Weight {
            name,
            parts,
            tensor,
        }))
    }

    /// The projection of upload `weight` with the optional bias upload, compressed when
    /// `compress` (both read to the host), dense otherwise.
    fn projection(
        &mut self,
        weight: usize,
        bias: Option<usize>,
        compress: bool,
    ) -> Result<Projection<R>> {
        let w = self.read(weight, compress)?;
        let b = bias.map(|b| self.read(b, compress)).transpose()?;
        self.build(w, b)
    }

    fn build(&self, w: Upload<R>, bias: Option<Upload<R>>) -> Result<Projection<R>> {
        Ok(match w {
            Upload::Dense(weight) => Projection::dense(weight, bias.map(Upload::dense))?,
            Upload::Host(w) => {
                let bias = bias.map(|b| match b {
                    Upload::Host(b) => b,
                    Upload::Dense(_) => unreachable!("a bias is read like its weight"),
                });
                let (layer, bias) =
                    self.compression
                        .build(self.client, &w, bias.as_ref(), self.dtype)?;
                Projection::compressed(w.parts, layer, bias)
            }
        })
    }
}

/// One layer's uploads, by role, as [`DecoderLayer::assemble`] asks for them.
struct LayerReader<'r, 'a, R: Runtime> {
    reader: &'r mut Reader<'a, R>,
    roles: HashMap<Role, usize>,
}

impl<R: Runtime> LayerParts<R> for LayerReader<'_, '_, R> {
    fn weight(&mut self, role: Role) -> Result<Option<Weight<R>>> {
        match self.roles.get(&role) {
            Some(&i) => Ok(Some(self.reader.read(i, false)?.dense())),
            None => Ok(None),
        }
    }

    fn projection(&mut self, weight: Role, bias: Option<Role>) -> Result<Projection<R>> {
        let w = *self.roles.get(&weight).ok_or_else(|| {
            ModelError::param("layer", format!("the plan has no {weight:?} upload"))
        })?;
        let b = bias.and_then(|b| self.roles.get(&b).copied());
        let compress = Slot::of(weight).is_some_and(|s| self.reader.compression.applies_to(s));
        self.reader.projection(w, b, compress)
    }
}

impl<R: Runtime> Model<R> {
    /// Loads `config.json` (any supported family), `generation_config.json` and the safetensors
    /// weights of `dir` and uploads the weights in the chosen dtype. `progress` is called after
    /// every upload.
    pub fn load(
        client: &ComputeClient<R>,
        dir: &Path,
        options: &LoadOptions,
        progress: &mut dyn FnMut(&LoadProgress),
    ) -> Result<(Self, LoadReport)> {
        let start = Instant::now();
        // Uploads are device work that must stay out of another session's graph capture.
        let _device = crate::engine::device_lock::shared();
        if !dir.is_dir() {
            return Err(ModelError::io(dir, "no such model directory"));
        }
        let config = ModelConfig::from_dir(dir)?;
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
        if let Some(note) = compression.decode_notice(client, dtype, config.hidden_size) {
            notices.push(note);
        }
        let (mut weights, largest_weight) = planned_weight_bytes(&plan, dtype, compression);
        if options.screen_lm_head {
            if compression.applies_to(Slot::LmHead) {
                return Err(ModelError::param(
                    "screen_lm_head",
                    "the LM head is quantized already: screening needs a float LM head",
                ));
            }
            weights += crate::engine::screen::planned_bytes(config.vocab_size, config.hidden_size);
        }
        let device = DeviceMemory {
            // On wgpu CubeCL's page size is the storage-buffer binding limit, a hard limit on
            // one buffer; on CUDA it is only the size of its memory pools' pages.
            max_allocation: (runtime != "cuda").then(|| client.properties().memory.max_page_size),
            free: options.device_free_bytes,
        };
        MemoryPlan::new(&config, dtype, max_len, weights, largest_weight)
            .check(&device, runtime)?;
        let rope = RopeCache::with_scaling(
            client,
            max_len,
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
        )?;

        // Uploads in plan order. Compressed projections are read to the host in f32 and
        // converted as soon as they are complete, so at most one is on the host at a time.
        let mut reader = Reader {
            client,
            store: &store,
            plan: &plan,
            dtype,
            compression,
            done: 0,
            progress,
        };
        let find = |target: Target| plan.uploads.iter().position(|u| u.target == target);
        let embedding = find(Target::Embedding).expect("planned first");
        // A tied LM head that is compressed: its own copy from the embedding table, built while
        // the table is on the host (then the table is uploaded dense for the lookups).
        let (embed_tokens, tied_head) = if plan.tied && compression.applies_to(Slot::LmHead) {
            let Upload::Host(table) = reader.read(embedding, true)? else {
                unreachable!("read to the host")
            };
            let tensor = DeviceTensor::from_f32(client, &table.data, &table.shape, dtype)?;
            let embed = Weight {
                name: table.parts.join(" + "),
                parts: table.parts.clone(),
                tensor,
            };
            (embed, Some(reader.build(Upload::Host(table), None)?))
        } else {
            (reader.read(embedding, false)?.dense(), None)
        };
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let roles = plan
                .uploads
                .iter()
                .enumerate()
                .filter_map(|(i, u)| match u.target {
                    Target::Layer(layer, role) if layer == l => Some((role, i)),
                    _ => None,
                })
                .collect();
            let mut parts = LayerReader {
                reader: &mut reader,
                roles,
            };
            layers.push(DecoderLayer::assemble(&mut parts)?);
        }
        let norm = reader
            .read(find(Target::FinalNorm).expect("planned"), false)?
            .dense();
        let lm_head = match find(Target::LmHead) {
            None => tied_head,
            Some(i) => Some(reader.projection(i, None, compression.applies_to(Slot::LmHead))?),
        };

        let dense_weight_bytes = plan
            .specs()
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
        let mut model = Self::from_parts(
            client,
            config,
            generation,
            dir,
            dtype,
            max_len,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
        );
        if options.screen_lm_head {
            model.build_screen()?;
        }
        report.weight_bytes = model.weight_bytes();
        Ok((model, report))
    }
}
