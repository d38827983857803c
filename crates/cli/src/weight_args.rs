//! The weight-format flags shared by `generate` and `bench-generate`.

use clap::Args;
use model::{Compression, Decode8, Int4Group, LoadReport, QuantMode};

#[derive(Args, Debug, Clone)]
pub struct WeightArgs {
    /// Prune the MLP weights (gate, up, down projections) to this block sparsity in [0, 1) at
    /// load and run them with the block-sparse kernel. This CHANGES THE MODEL'S OUTPUT: it
    /// trades accuracy for speed and memory.
    #[arg(
        long,
        value_name = "RATIO",
        allow_negative_numbers = true,
        conflicts_with = "quant"
    )]
    pub sparsify: Option<f64>,
    /// Quantize the linear layers at load (not the embeddings or norms): w8a8 = int8 weights
    /// and activations, fp8 = e4m3 weights and activations, w4a16 = int4 weights with float
    /// activations. Lossy: the output changes a little.
    #[arg(long, value_parser = ["none", "w8a8", "fp8", "w4a16"], default_value = "none")]
    pub quant: String,
    /// Int4 scale groups along K for --quant w4a16: `auto` (128 where K allows, else 64, 32,
    /// else per channel), `channel`, or a size (a multiple of 8 dividing every K).
    #[arg(long, default_value = "auto")]
    pub quant_group: String,
    /// Quantize the LM head too (with --quant).
    #[arg(long)]
    pub quant_lm_head: bool,
    /// How --quant w8a8 and fp8 multiply at decode: `float` multiplies the 8-bit weights with
    /// the activation itself on f16 tensor cores (CUDA, bf16/f16; no quantize pass, x rounded
    /// to f16), `float-simt` multiplies them with the activation in f32 on the SIMT cores (any
    /// runtime and dtype; x not rounded), `codes` quantizes the activation per row and
    /// multiplies 8-bit codes (as prefill does); `auto` is `float-simt` where that kernel runs
    /// (hidden and intermediate sizes multiples of 16), else `codes`.
    #[arg(
        long,
        value_parser = ["auto", "codes", "float", "float-simt"],
        default_value = "auto"
    )]
    pub quant_decode: String,
    /// Greedy decoding screens the float LM head with an int8 copy of it and computes again
    /// from the float head only the rows that can be the largest: the same tokens, about half
    /// the head's bytes a step, one byte a vocabulary weight more memory. One-sequence greedy
    /// decoding only (generate, chat, bench-generate; not serve); not with --quant-lm-head.
    #[arg(long, conflicts_with = "quant_lm_head")]
    pub screen_lm_head: bool,
}

impl WeightArgs {
    pub fn compression(&self) -> anyhow::Result<Compression> {
        let group = match self.quant_group.as_str() {
            "auto" => Int4Group::Auto,
            "channel" => Int4Group::PerChannel,
            g => Int4Group::Size(g.parse().map_err(|_| {
                anyhow::anyhow!("--quant-group: expected auto, channel or a size, got '{g}'")
            })?),
        };
        let mode = match self.quant.as_str() {
            "w8a8" => Some(QuantMode::W8A8),
            "fp8" => Some(QuantMode::Fp8),
            "w4a16" => Some(QuantMode::W4A16 { group }),
            _ => None,
        };
        if self.quant_lm_head && mode.is_none() {
            anyhow::bail!("--quant-lm-head needs --quant w8a8, fp8 or w4a16");
        }
        if self.quant_group != "auto" && !matches!(mode, Some(QuantMode::W4A16 { .. })) {
            anyhow::bail!("--quant-group applies to --quant w4a16 only");
        }
        let decode = match self.quant_decode.as_str() {
            "float" => Decode8::Float,
            "float-simt" => Decode8::FloatSimt,
            "codes" => Decode8::Codes,
            _ => Decode8::Auto,
        };
        if decode != Decode8::Auto && !matches!(mode, Some(QuantMode::W8A8 | QuantMode::Fp8)) {
            anyhow::bail!("--quant-decode applies to --quant w8a8 and fp8 only");
        }
        Ok(match (self.sparsify, mode) {
            (Some(sparsity), _) => Compression::Sparsify { sparsity },
            (None, Some(mode)) => Compression::Quant {
                mode,
                lm_head: self.quant_lm_head,
                decode,
            },
            (None, None) => Compression::None,
        })
    }
}

/// The one-line weight-memory report (only when the weights are not plain dense ones, or the
/// LM head is `screened` by an int8 copy).
pub fn memory_line(
    report: &LoadReport,
    compression: Compression,
    screened: bool,
) -> Option<String> {
    let mut what = match compression {
        Compression::None if !screened => return None,
        Compression::None => "linear layers dense".to_string(),
        Compression::Sparsify { sparsity } => {
            format!(
                "MLP pruned to {:.0}% block sparsity (accuracy trade-off)",
                sparsity * 100.0
            )
        }
        Compression::Quant {
            mode,
            lm_head,
            decode,
        } => format!(
            "linear layers quantized to {}{}{}",
            mode.name(),
            if lm_head {
                ", LM head too"
            } else {
                ", LM head in float"
            },
            match decode {
                Decode8::Auto => "",
                Decode8::Codes => ", --quant-decode codes",
                Decode8::Float => ", --quant-decode float",
                Decode8::FloatSimt => ", --quant-decode float-simt",
            }
        ),
    };
    if screened {
        what.push_str("; the LM head screened by an int8 copy for greedy decoding");
    }
    Some(format!(
        "weights: {} MB on the device, {} MB dense ({:.2}x); {what}",
        report.weight_bytes / 1_000_000,
        report.dense_weight_bytes / 1_000_000,
        report.weight_bytes as f64 / report.dense_weight_bytes.max(1) as f64
    ))
}
