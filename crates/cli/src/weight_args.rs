//! The weight-format flags shared by `generate` and `bench-generate`.

use clap::Args;
use cubellm::model::{Compression, LoadReport};

#[derive(Args, Debug, Clone, Default)]
pub struct WeightArgs {
    /// Prune the MLP weights (gate, up, down projections) to this block sparsity in [0, 1) at
    /// load and run them with the block-sparse kernel. This CHANGES THE MODEL'S OUTPUT: it
    /// trades accuracy for speed and memory.
    #[arg(long, value_name = "RATIO", allow_negative_numbers = true)]
    pub sparsify: Option<f64>,
}

impl WeightArgs {
    pub fn compression(&self) -> Compression {
        match self.sparsify {
            Some(sparsity) => Compression::Sparsify { sparsity },
            None => Compression::None,
        }
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
    };
    Some(format!(
        "weights: {} MB on the device, {} MB dense ({:.2}x); {what}",
        report.weight_bytes / 1_000_000,
        report.dense_weight_bytes / 1_000_000,
        report.weight_bytes as f64 / report.dense_weight_bytes.max(1) as f64
    ))
}
