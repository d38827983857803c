//! A Qwen2 decoder built from Burn modules, twice: all-Burn (Burn tensor ops only) and with
//! cubellm's kernels swapped in (`cubellm_burn` modules and `ops::burn` functions). Loads the
//! transformers fixture `crates/model/tests/fixtures/hf/qwen2-4layer`, checks both models' logits
//! of the prompt against transformers' (relative L2 per position within 1e-4, f32) and against
//! each other, checks a greedy decode of a few tokens against transformers' greedy tokens, and
//! prints prefill and decode tokens/s of both. Any mismatch: one line on stderr, exit status 1.
//!
//! Both models run the same algorithm: no KV cache, every decode step recomputes the whole
//! sequence (so the decode numbers are a comparison, not a decode benchmark).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use burn_core as burn;
use burn_core::module::{Module, Param};
use burn_cubecl::tensor::CubeTensor;
use burn_tensor::activation::{silu, softmax};
use burn_tensor::{Device, Int, Tensor, TensorData};
use cubellm_burn::{BurnRuntime, Linear};
use ops::matmul::Activation;
use ops::rope::RopeCache;

type Res<T> = Result<T, String>;

/// The `config.json` fields a Qwen2 decoder needs.
#[derive(Debug, Clone)]
struct Config {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    vocab: usize,
    eps: f64,
    theta: f64,
    tied: bool,
}

impl Config {
    fn load(dir: &Path) -> Res<Self> {
        let path = dir.join("config.json");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let j: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let int = |k: &str| {
            j[k].as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| format!("config.json: no integer {k}"))
        };
        let hidden = int("hidden_size")?;
        let heads = int("num_attention_heads")?;
        let theta = j["rope_theta"]
            .as_f64()
            .or_else(|| j["rope_parameters"]["rope_theta"].as_f64())
            .unwrap_or(10000.0);
        Ok(Self {
            hidden,
            heads,
            kv_heads: int("num_key_value_heads").unwrap_or(heads),
            head_dim: int("head_dim").unwrap_or(hidden / heads),
            layers: int("num_hidden_layers")?,
            vocab: int("vocab_size")?,
            eps: j["rms_norm_eps"].as_f64().unwrap_or(1e-6),
            theta,
            tied: j["tie_word_embeddings"].as_bool().unwrap_or(false),
        })
    }
}

/// Every tensor of a safetensors file, in f32 (or i32 for int tensors), with its shape.
struct HostTensors {
    floats: HashMap<String, (Vec<f32>, Vec<usize>)>,
    ints: HashMap<String, Vec<i32>>,
}

impl HostTensors {
    fn load(path: &Path) -> Res<Self> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut floats = HashMap::new();
        let mut ints = HashMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let shape = view.shape().to_vec();
            use safetensors::Dtype;
            let values: Vec<f32> = match view.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                Dtype::F16 => data
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
                Dtype::I32 => {
                    let v = data
                        .chunks_exact(4)
                        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect();
                    ints.insert(name, v);
                    continue;
                }
                other => return Err(format!("{name}: dtype {other:?} is not read here")),
            };
            floats.insert(name, (values, shape));
        }
        Ok(Self { floats, ints })
    }

    fn float(&self, name: &str) -> Res<&(Vec<f32>, Vec<usize>)> {
        self.floats
            .get(name)
            .ok_or_else(|| format!("tensor {name} is missing"))
    }
}

/// Loads host tensors onto `CubeBackend<R>` as f32 Burn tensors.
struct Loader<'a, R: BurnRuntime> {
    host: &'a HostTensors,
    device: R::Device,
}

impl<R: BurnRuntime> Loader<'_, R> {
    fn tensor<const D: usize>(&self, name: &str) -> Res<Tensor<D>> {
        let (values, shape) = self.host.float(name)?;
        self.upload(values.clone(), shape.clone())
            .map_err(|e| format!("{name}: {e}"))
    }

    fn upload<const D: usize>(&self, values: Vec<f32>, shape: Vec<usize>) -> Res<Tensor<D>> {
        cubellm_burn::tensor_from_data::<R, D>(TensorData::new(values, shape), &self.device)
            .map_err(|e| e.to_string())
    }

    /// The rows of several `[n_i, K]` tensors stacked into one `[Σ n_i, K]` (q|k|v, as the
    /// engine fuses them); `None` if the first name is absent.
    fn stacked<const D: usize>(&self, names: &[String]) -> Res<Option<Tensor<D>>> {
        if !self.host.floats.contains_key(&names[0]) {
            return Ok(None);
        }
        let mut values = Vec::new();
        let mut shape: Vec<usize> = Vec::new();
        for n in names {
            let (v, s) = self.host.float(n)?;
            values.extend_from_slice(v);
            if shape.is_empty() {
                shape = s.clone();
            } else {
                shape[0] += s[0];
            }
        }
        self.upload(values, shape).map(Some)
    }
}

// ---------------------------------------------------------------------------------------------
// All-Burn: Burn modules and Burn tensor ops only.

/// `y = x · Wᵀ + b` with Burn's matmul (weight in PyTorch's `[N, K]` layout).
#[derive(Module, Debug)]
struct BurnLinear {
    weight: Param<Tensor<2>>,
    bias: Option<Param<Tensor<1>>>,
}

impl BurnLinear {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let y = x.matmul(self.weight.val().transpose());
        match &self.bias {
            Some(b) => y + b.val().unsqueeze_dim(0),
            None => y,
        }
    }
}

#[derive(Module, Debug)]
struct BurnRmsNorm {
    weight: Param<Tensor<1>>,
    eps: f64,
}

impl BurnRmsNorm {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let ms = x.clone().powi_scalar(2).mean_dim(1);
        x * (ms + self.eps).sqrt().recip() * self.weight.val().unsqueeze_dim(0)
    }
}

#[derive(Module, Debug)]
struct BurnLayer {
    input_norm: BurnRmsNorm,
    q: BurnLinear,
    k: BurnLinear,
    v: BurnLinear,
    o: BurnLinear,
    post_norm: BurnRmsNorm,
    gate: BurnLinear,
    up: BurnLinear,
    down: BurnLinear,
}

#[derive(Module, Debug)]
struct BurnQwen2 {
    embed: Param<Tensor<2>>,
    layers: Vec<BurnLayer>,
    norm: BurnRmsNorm,
    lm_head: BurnLinear,
    /// RoPE tables `[max_positions, head_dim]` (transformers' full-width cos and sin).
    cos: Tensor<2>,
    sin: Tensor<2>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

/// transformers' `rotate_half`: `cat(-x2, x1)` over the last dimension.
fn rotate_half(x: Tensor<3>) -> Tensor<3> {
    let d = x.dims()[2];
    let x1 = x.clone().narrow(2, 0, d / 2);
    let x2 = x.narrow(2, d / 2, d / 2);
    Tensor::cat(vec![x2.neg(), x1], 2)
}

impl BurnQwen2 {
    fn load<R: BurnRuntime>(cfg: &Config, w: &Loader<'_, R>) -> Res<Self> {
        let lin = |p: &str, bias: bool| -> Res<BurnLinear> {
            Ok(BurnLinear {
                weight: Param::from_tensor(w.tensor(&format!("{p}.weight"))?),
                bias: if bias {
                    Some(Param::from_tensor(w.tensor(&format!("{p}.bias"))?))
                } else {
                    None
                },
            })
        };
        let norm = |p: &str| -> Res<BurnRmsNorm> {
            Ok(BurnRmsNorm {
                weight: Param::from_tensor(w.tensor(&format!("{p}.weight"))?),
                eps: cfg.eps,
            })
        };
        let mut layers = Vec::new();
        for i in 0..cfg.layers {
            let p = format!("model.layers.{i}");
            layers.push(BurnLayer {
                input_norm: norm(&format!("{p}.input_layernorm"))?,
                q: lin(&format!("{p}.self_attn.q_proj"), true)?,
                k: lin(&format!("{p}.self_attn.k_proj"), true)?,
                v: lin(&format!("{p}.self_attn.v_proj"), true)?,
                o: lin(&format!("{p}.self_attn.o_proj"), false)?,
                post_norm: norm(&format!("{p}.post_attention_layernorm"))?,
                gate: lin(&format!("{p}.mlp.gate_proj"), false)?,
                up: lin(&format!("{p}.mlp.up_proj"), false)?,
                down: lin(&format!("{p}.mlp.down_proj"), false)?,
            });
        }
        let head = if cfg.tied {
            "model.embed_tokens"
        } else {
            "lm_head"
        };
        let (cos, sin) = rope_tables(cfg, MAX_POSITIONS);
        Ok(Self {
            embed: Param::from_tensor(w.tensor("model.embed_tokens.weight")?),
            layers,
            norm: norm("model.norm")?,
            lm_head: lin(head, false)?,
            cos: w.upload(cos, vec![MAX_POSITIONS, cfg.head_dim])?,
            sin: w.upload(sin, vec![MAX_POSITIONS, cfg.head_dim])?,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
        })
    }

    /// Logits `[S, V]` of the tokens `ids [S]`.
    fn forward(&self, ids: Tensor<1, Int>) -> Tensor<2> {
        let s = ids.dims()[0];
        let (hq, hkv, d) = (self.heads, self.kv_heads, self.head_dim);
        let cos = self.cos.clone().narrow(0, 0, s).unsqueeze_dim::<3>(0);
        let sin = self.sin.clone().narrow(0, 0, s).unsqueeze_dim::<3>(0);
        let rope = |x: Tensor<3>| x.clone() * cos.clone() + rotate_half(x) * sin.clone();
        // Causal mask: -inf above the diagonal.
        let device = ids.device();
        let mask: Vec<f32> = (0..s * s)
            .map(|i| {
                if i % s > i / s {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::<2>::from_data(TensorData::new(mask, [s, s]), &device).unsqueeze_dim(0);
        let scale = 1.0 / (d as f64).sqrt();

        let mut h = self.embed.val().select(0, ids);
        for l in &self.layers {
            let x = l.input_norm.forward(h.clone());
            // [S, H*D] -> [H, S, D]
            let heads = |t: Tensor<2>, n: usize| t.reshape([s, n, d]).swap_dims(0, 1);
            let q = rope(heads(l.q.forward(x.clone()), hq));
            let mut k = rope(heads(l.k.forward(x.clone()), hkv));
            let mut v = heads(l.v.forward(x), hkv);
            if hq != hkv {
                let rep = hq / hkv;
                k = k
                    .unsqueeze_dim::<4>(1)
                    .repeat_dim(1, rep)
                    .reshape([hq, s, d]);
                v = v
                    .unsqueeze_dim::<4>(1)
                    .repeat_dim(1, rep)
                    .reshape([hq, s, d]);
            }
            let scores = q.matmul(k.swap_dims(1, 2)) * scale + mask.clone();
            let o = softmax(scores, 2)
                .matmul(v)
                .swap_dims(0, 1)
                .reshape([s, hq * d]);
            h = h + l.o.forward(o);
            let x = l.post_norm.forward(h.clone());
            h = h + l
                .down
                .forward(silu(l.gate.forward(x.clone())) * l.up.forward(x));
        }
        self.lm_head.forward(self.norm.forward(h))
    }
}

/// transformers' RoPE tables `[max, D]`: `cos/sin(p · inv_freq[i mod D/2])`.
fn rope_tables(cfg: &Config, max: usize) -> (Vec<f32>, Vec<f32>) {
    let d = cfg.head_dim;
    let inv: Vec<f64> = (0..d / 2)
        .map(|i| cfg.theta.powf(-((2 * i) as f64) / d as f64))
        .collect();
    let mut cos = Vec::with_capacity(max * d);
    let mut sin = Vec::with_capacity(max * d);
    for p in 0..max {
        for i in 0..d {
            let a = p as f64 * inv[i % (d / 2)];
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

const MAX_POSITIONS: usize = 256;

// ---------------------------------------------------------------------------------------------
// cubellm's kernels: `cubellm_burn::Linear` modules (q|k|v fused in one, o and down with the
// residual in the epilogue, the tied LM head) and `ops::burn` for embedding, RMSNorm, RoPE,
// causal GQA attention and the fused SwiGLU gate/up product. Its layers are plain structs of
// Burn modules and parameters: Burn's `Module` derive cannot take a struct generic over the
// runtime whose fields are modules generic over it.

struct FastLayer<R: BurnRuntime> {
    input_norm: Param<Tensor<1>>,
    qkv: Linear<R>,
    o: Linear<R>,
    post_norm: Param<Tensor<1>>,
    gate: Param<Tensor<2>>,
    up: Param<Tensor<2>>,
    down: Linear<R>,
}

struct FastQwen2<R: BurnRuntime> {
    embed: Param<Tensor<2>>,
    layers: Vec<FastLayer<R>>,
    norm: Param<Tensor<1>>,
    lm_head: Linear<R>,
    rope: RopeCache<R>,
    cfg: Config,
}

fn prim<R: BurnRuntime, const D: usize>(t: Tensor<D>) -> Res<CubeTensor<R>> {
    R::float_primitive("burn-qwen2", t).map_err(|e| e.to_string())
}

impl<R: BurnRuntime> FastQwen2<R> {
    fn load(cfg: &Config, w: &Loader<'_, R>) -> Res<Self> {
        let e = |e: ops::OpsError| e.to_string();
        let mut layers = Vec::new();
        for i in 0..cfg.layers {
            let p = format!("model.layers.{i}");
            let names = |suffix: &str| -> Vec<String> {
                ["q", "k", "v"]
                    .iter()
                    .map(|x| format!("{p}.self_attn.{x}_proj.{suffix}"))
                    .collect()
            };
            let qkv_w = w
                .stacked::<2>(&names("weight"))?
                .ok_or("no q_proj weight")?;
            let qkv_b = w.stacked::<1>(&names("bias"))?;
            layers.push(FastLayer {
                input_norm: Param::from_tensor(w.tensor(&format!("{p}.input_layernorm.weight"))?),
                qkv: Linear::new(qkv_w, qkv_b).map_err(e)?,
                o: Linear::new(w.tensor(&format!("{p}.self_attn.o_proj.weight"))?, None)
                    .map_err(e)?,
                post_norm: Param::from_tensor(
                    w.tensor(&format!("{p}.post_attention_layernorm.weight"))?,
                ),
                gate: Param::from_tensor(w.tensor(&format!("{p}.mlp.gate_proj.weight"))?),
                up: Param::from_tensor(w.tensor(&format!("{p}.mlp.up_proj.weight"))?),
                down: Linear::new(w.tensor(&format!("{p}.mlp.down_proj.weight"))?, None)
                    .map_err(e)?,
            });
        }
        let head = if cfg.tied {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let client = R::client(&w.device);
        Ok(Self {
            embed: Param::from_tensor(w.tensor("model.embed_tokens.weight")?),
            layers,
            norm: Param::from_tensor(w.tensor("model.norm.weight")?),
            lm_head: Linear::new(w.tensor(head)?, None).map_err(e)?,
            rope: RopeCache::new(&client, MAX_POSITIONS, cfg.head_dim, cfg.theta).map_err(e)?,
            cfg: cfg.clone(),
        })
    }

    /// Logits `[S, V]` of the tokens `ids [S]`.
    fn forward(&self, ids: Tensor<1, Int>) -> Res<Tensor<2>> {
        let e = |e: ops::OpsError| e.to_string();
        let c = &self.cfg;
        let s = ids.dims()[0];
        let (hq, hkv, d) = (c.heads, c.kv_heads, c.head_dim);
        let eps = c.eps as f32;
        let positions: Vec<u32> = (0..s as u32).collect();
        let scale = 1.0 / (d as f32).sqrt();
        let ids = R::int_primitive("burn-qwen2", ids).map_err(e)?;
        let mut h: Tensor<2> =
            R::float_tensor(ops::burn::embedding(prim(self.embed.val())?, ids).map_err(e)?);
        for l in &self.layers {
            let x =
                ops::burn::rms_norm(prim(h.clone())?, prim(l.input_norm.val())?, eps).map_err(e)?;
            let qkv: Tensor<2> = l.qkv.forward(R::float_tensor(x)).map_err(e)?;
            let part = |start: usize, n: usize| -> Res<_> {
                prim(qkv.clone().narrow(1, start * d, n * d).reshape([s, n, d]))
            };
            let q = ops::burn::rope(part(0, hq)?, &positions, &self.rope).map_err(e)?;
            let k = ops::burn::rope(part(hq, hkv)?, &positions, &self.rope).map_err(e)?;
            let v = part(hq + hkv, hkv)?;
            let o = ops::burn::attention(q, k, v, scale, true).map_err(e)?;
            let o: Tensor<3> = R::float_tensor(o);
            h = l.o.forward_residual(o.reshape([s, hq * d]), h).map_err(e)?;
            let x =
                ops::burn::rms_norm(prim(h.clone())?, prim(l.post_norm.val())?, eps).map_err(e)?;
            let g =
                ops::burn::gated_mlp(x, prim(l.gate.val())?, prim(l.up.val())?, Activation::Silu)
                    .map_err(e)?;
            h = l.down.forward_residual(R::float_tensor(g), h).map_err(e)?;
        }
        let x = ops::burn::rms_norm(prim(h)?, prim(self.norm.val())?, eps).map_err(e)?;
        self.lm_head.forward(R::float_tensor(x)).map_err(e)
    }
}

// ---------------------------------------------------------------------------------------------

fn host(t: Tensor<2>) -> Res<Vec<f32>> {
    let data = cubecl::future::block_on(t.into_data_async()).map_err(|e| format!("{e:?}"))?;
    Ok(data.iter::<f32>().collect())
}

/// `||a - b|| / ||b||` of each row of `vocab` values: the worst row and its index.
fn worst_row(a: &[f32], b: &[f32], vocab: usize) -> (usize, f64) {
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| {
            let num: f64 = x
                .iter()
                .zip(y)
                .map(|(p, q)| (*p as f64 - *q as f64).powi(2))
                .sum();
            let den: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum();
            let r = (num / den.max(f64::MIN_POSITIVE)).sqrt();
            if r.is_nan() {
                f64::INFINITY
            } else {
                r
            }
        })
        .enumerate()
        .fold((0, 0.0), |w, (i, r)| if r > w.1 { (i, r) } else { w })
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

struct Args {
    runtime: runtime::RuntimeChoice,
    fixture: PathBuf,
    decode: usize,
    repeats: usize,
}

fn parse_args() -> Res<Args> {
    let mut args = Args {
        runtime: runtime::RuntimeChoice::Auto,
        fixture: Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../crates/model/tests/fixtures/hf/qwen2-4layer"),
        decode: 8,
        repeats: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--runtime" => {
                args.runtime =
                    runtime::RuntimeChoice::from_str(&value()?).map_err(|e| e.to_string())?
            }
            "--fixture" => args.fixture = PathBuf::from(value()?),
            "--decode" => args.decode = value()?.parse().map_err(|e| format!("--decode: {e}"))?,
            "--repeats" => {
                args.repeats = value()?.parse().map_err(|e| format!("--repeats: {e}"))?
            }
            "-h" | "--help" => {
                println!(
                    "usage: burn-qwen2 [--runtime wgpu|cuda|auto] [--fixture DIR] [--decode N] \
                     [--repeats N]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other} (see --help)")),
        }
    }
    Ok(args)
}

/// One model's run: logits of the prompt, prefill seconds (mean of `repeats` timed runs after
/// the checked one), greedy tokens and the seconds of their second (warm) decode.
struct Run {
    logits: Vec<f32>,
    prefill_s: f64,
    tokens: Vec<u32>,
    decode_s: f64,
}

fn run_model(
    forward: &dyn Fn(Tensor<1, Int>) -> Res<Tensor<2>>,
    prompt: &[u32],
    device: &Device,
    vocab: usize,
    decode: usize,
    repeats: usize,
) -> Res<Run> {
    let ids = |t: &[u32]| {
        let v: Vec<i32> = t.iter().map(|&x| x as i32).collect();
        Tensor::<1, Int>::from_data(TensorData::new(v, [t.len()]), device)
    };
    // The checked run (also compiles the kernels).
    let logits = host(forward(ids(prompt))?)?;
    let start = Instant::now();
    for _ in 0..repeats {
        host(forward(ids(prompt))?)?;
    }
    let prefill_s = start.elapsed().as_secs_f64() / repeats.max(1) as f64;
    // Greedy decode twice: the first pass compiles the kernels of each new sequence length
    // (Burn's and ours), the second is timed.
    let greedy = || -> Res<Vec<u32>> {
        let mut seq = prompt.to_vec();
        let mut tokens = Vec::new();
        for _ in 0..decode {
            let s = seq.len();
            let last = forward(ids(&seq))?.narrow(0, s - 1, 1);
            let next = argmax(&host(last)?[..vocab]);
            tokens.push(next);
            seq.push(next);
        }
        Ok(tokens)
    };
    let tokens = greedy()?;
    let start = Instant::now();
    if greedy()? != tokens {
        return Err("two greedy decodes of one model differ".into());
    }
    let decode_s = start.elapsed().as_secs_f64();
    Ok(Run {
        logits,
        prefill_s,
        tokens,
        decode_s,
    })
}

fn run_on<R: BurnRuntime>(args: &Args, runtime_name: &str) -> Res<()> {
    // Our kernels accumulate f32 products in f32. Burn's own f32 matmul runs on TF32 tensor
    // cores on CUDA (10-bit mantissa inputs, about 1e-3 relative error per product), so the
    // all-Burn model is held to that precision there (and the comparison between the two).
    const TOL: f64 = 1e-4;
    let burn_tol = if runtime_name.contains("cuda") {
        5e-3
    } else {
        TOL
    };
    let dir = &args.fixture;
    let cfg = Config::load(dir)?;
    let weights = HostTensors::load(&dir.join("model.safetensors"))?;
    let reference = HostTensors::load(&dir.join("reference.safetensors"))?;
    let prompt: Vec<u32> = reference
        .ints
        .get("prompt_ids")
        .ok_or("reference.safetensors: no prompt_ids")?
        .iter()
        .map(|&v| v as u32)
        .collect();
    let (want, _) = reference.float("logits")?;
    let greedy: Vec<u32> = reference
        .ints
        .get("greedy_ids")
        .map(|v| v.iter().map(|&x| x as u32).collect())
        .unwrap_or_default();
    if prompt.len() + args.decode > MAX_POSITIONS {
        return Err(format!("at most {MAX_POSITIONS} positions"));
    }

    let device = R::Device::default();
    let loader = Loader::<R> {
        host: &weights,
        device: device.clone(),
    };
    let burn_device = cubellm_burn::device::<R>(&device);
    let all_burn = BurnQwen2::load(&cfg, &loader)?;
    let fast = FastQwen2::<R>::load(&cfg, &loader)?;
    println!(
        "runtime: {runtime_name}; Qwen2 {} layers, hidden {}, {} heads ({} KV), vocab {}; \
         prompt {} tokens, {} decode steps",
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.kv_heads,
        cfg.vocab,
        prompt.len(),
        args.decode
    );

    let burn_fwd = |ids: Tensor<1, Int>| Ok(all_burn.forward(ids));
    let fast_fwd = |ids: Tensor<1, Int>| fast.forward(ids);
    let runs = [
        (
            "all-Burn",
            run_model(
                &burn_fwd,
                &prompt,
                &burn_device,
                cfg.vocab,
                args.decode,
                args.repeats,
            )?,
        ),
        (
            "cubellm kernels",
            run_model(
                &fast_fwd,
                &prompt,
                &burn_device,
                cfg.vocab,
                args.decode,
                args.repeats,
            )?,
        ),
    ];
    let mut failures = Vec::new();
    for ((name, run), tol) in runs.iter().zip([burn_tol, TOL]) {
        let (pos, err) = worst_row(&run.logits, want, cfg.vocab);
        println!(
            "{name:>16}: logits vs transformers: worst relative L2 {err:.2e} (position {pos})"
        );
        if err > tol {
            failures.push(format!(
                "{name} logits differ from transformers' at position {pos}: relative L2 {err:.2e} > {tol:e}"
            ));
        }
        let n = greedy.len().min(run.tokens.len());
        if run.tokens[..n] != greedy[..n] {
            failures.push(format!(
                "{name} greedy tokens {:?} differ from transformers' {:?}",
                run.tokens,
                &greedy[..n]
            ));
        }
    }
    let (pos, err) = worst_row(&runs[1].1.logits, &runs[0].1.logits, cfg.vocab);
    println!(
        "{:>16}: cubellm vs all-Burn logits: worst relative L2 {err:.2e} (position {pos})",
        ""
    );
    if err > burn_tol {
        failures.push(format!(
            "the two models' logits differ at position {pos}: relative L2 {err:.2e} > {burn_tol:e}"
        ));
    }
    if runs[0].1.tokens != runs[1].1.tokens {
        failures.push(format!(
            "greedy tokens differ: all-Burn {:?}, cubellm {:?}",
            runs[0].1.tokens, runs[1].1.tokens
        ));
    }
    for (name, run) in &runs {
        println!(
            "{name:>16}: prefill {:.1} tok/s ({} tokens, {:.1} ms), decode {:.1} tok/s ({} tokens, \
             full recompute per step), greedy {:?}",
            prompt.len() as f64 / run.prefill_s,
            prompt.len(),
            run.prefill_s * 1e3,
            run.tokens.len() as f64 / run.decode_s,
            run.tokens.len(),
            run.tokens
        );
    }
    if let Some(first) = failures.first() {
        return Err(first.clone());
    }
    println!("ok: both models match transformers' logits and each other");
    Ok(())
}

fn main() {
    let result = parse_args().and_then(|args| {
        let backend = runtime::resolve(args.runtime).map_err(|e| e.to_string())?;
        runtime::with_runtime!(backend, |client: R| {
            let _ = client;
            run_on::<R>(&args, backend.name())
        })
    });
    if let Err(e) = result {
        eprintln!("burn-qwen2: {e}");
        std::process::exit(1);
    }
}
