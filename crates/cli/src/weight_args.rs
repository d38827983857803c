//! The weight-format flags shared by `generate` and `bench-generate`.

use clap::Args;
use cubellm::model::{Compression, LoadReport, QuantMode};

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
    /// and activations, fp8 = e4m3 weights and activations. Lossy: the output changes a little.
    #[arg(long, value_parser = ["none", "w8a8", "fp8"], default_value = "none")]
    pub quant: String,
    /// Quantize the LM head too (with --quant).
    #[arg(long)]
    pub quant_lm_head: bool,
}

impl WeightArgs {
    pub fn compression(&self) -> anyhow::Result<Compression> {
        let mode = match self.quant.as_str() {
            "w8a8" => Some(QuantMode::W8A8),
            "fp8" => Some(QuantMode::Fp8),
            _ => None,
        };
        if self.quant_lm_head && mode.is_none() {
            anyhow::bail!("--quant-lm-head needs --quant w8a8 or fp8");
        }
        Ok(match (self.sparsify, mode) {
            (Some(sparsity), _) => Compression::Sparsify { sparsity },
            (None, Some(mode)) => Compression::Quant {
                mode,
                lm_head: self.quant_lm_head,
            },
            (None, None) => Compression::None,
        })
    }
}

/// The one-line weight-memory report (only when the weights are not plain dense ones).
pub fn memory_line(report: &LoadReport, compression: Compression) -> Option<String> {
    let what = match compression {
        Compression::None => return None,
        Compression::Sparsify { sparsity } => {
            format!(
                "MLP pruned to {:.0}% block sparsity (accuracy trade-off)",
                sparsity * 100.0
            )
        }
        Compression::Quant { mode, lm_head } => format!(
            "linear layers quantized to {}{}",
            mode.name(),
            if lm_head {
                ", LM head too"
            } else {
                ", LM head in float"
            }
        ),
    };
    Some(format!(
        "weights: {} MB on the device, {} MB dense ({:.2}x); {what}",
        report.weight_bytes / 1_000_000,
        report.dense_weight_bytes / 1_000_000,
        report.weight_bytes as f64 / report.dense_weight_bytes.max(1) as f64
    ))
}
