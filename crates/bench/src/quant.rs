//! Cases for `quant`: the W8A8 linear (activation quantization pre-pass + int8 GEMM + dequant
//! epilogue, as the model runs it) at the prefill GEMM shapes (M = 512 and 4096, K = N = 4096)
//! and at the 1.5B model's decode shapes (M = 1 and 16), W4A16 at the same shapes, and the e4m3
//! GEMM on pre-quantized operands (what `torch._scaled_mm` times); the 8-bit decode shapes also
//! on the float-activation kernel (`... float`, no activation quantization). Names match
//! `scripts/bench_torch.py`'s peers; the decode cases compare with this run's own bf16 GEMVs
//! (`matmul` family, `gemv <name> 1x<k>x<n>`).
//!
//! Bytes are the minimum the op moves: the float activation in and out, the 8-bit weight and
//! its scales. A decode case (M <= 16) cycles through copies of its layer filling
//! [`SWEEP_WEIGHT_POOL`] bytes, so that its weight streams from DRAM as in the decode step (one
//! copy of any projection but the LM head would stay in a 50 MB L2 and time the cache).

use cubecl::prelude::*;
use ops::linear::{Epilogue, Linear, LinearWorkspace};
use ops::{caps, DType, DeviceTensor};
use quant::{gemm8_into, Fp8Linear, KernelChoice, QuantFormat, W4A16Linear, W8A8Linear};

use super::matmul::{MODEL_SHAPES, SWEEP_WEIGHT_POOL};
use super::Case;

/// Copies of a layer of `weight_bytes` that a decode case (M <= 16) cycles through (one for a
/// prefill case: its weight is read many times per call anyway).
fn copies(m: usize, weight_bytes: usize) -> usize {
    if m <= 16 {
        (SWEEP_WEIGHT_POOL / weight_bytes.max(1)).max(1)
    } else {
        1
    }
}

/// Items handed out in turn.
struct Rotation<T> {
    items: Vec<T>,
    next: usize,
}

impl<T> Rotation<T> {
    /// `make` called `count` times.
    fn new(count: usize, make: impl FnMut() -> T) -> Self {
        let items = std::iter::repeat_with(make).take(count.max(1)).collect();
        Self { items, next: 0 }
    }

    fn next(&mut self) -> &T {
        let i = self.next % self.items.len();
        self.next += 1;
        &self.items[i]
    }
}

fn pseudo_random(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// bf16 activations where the runtime has them (the model's dtype), else f16.
fn act_dtype<R: Runtime>(client: &ComputeClient<R>) -> DType {
    if caps::supports_dtype(client, DType::BF16) {
        DType::BF16
    } else {
        DType::F16
    }
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let dtype = act_dtype(client);
    let e = dtype.size() as f64;
    let mut out = Vec::new();
    let mut w8a8 = |name: String, m: usize, k: usize, n: usize, choice: KernelChoice| {
        let w = pseudo_random(n * k, 1);
        let mut layer = Rotation::new(copies(m, n * k), || {
            W8A8Linear::from_dense(client, &w, [n, k], dtype)
                .expect("bench weight")
                .with_kernel(choice)
        });
        let x = DeviceTensor::from_f32(client, &pseudo_random(m * k, 2), &[m, k], dtype).unwrap();
        let y = DeviceTensor::empty(client, &[m, n], dtype);
        let ws = LinearWorkspace::new(client, m, k, n, dtype);
        out.push(Case {
            name,
            dtype,
            bytes: e * (m * k + m * n) as f64 + (n * k + 4 * n) as f64,
            flops: 2.0 * (m * n * k) as f64,
            run: Box::new(move || {
                let e = Epilogue::NONE;
                layer
                    .next()
                    .forward_into(client, &x, e, &y, Some(&ws))
                    .unwrap()
            }),
        });
    };
    // "simt": the portable kernel, beside the default (tensor cores on CUDA).
    for m in [512, 4096] {
        w8a8(
            format!("w8a8 {m}x4096x4096"),
            m,
            4096,
            4096,
            KernelChoice::Auto,
        );
    }
    w8a8(
        "w8a8 512x4096x4096 simt".into(),
        512,
        4096,
        4096,
        KernelChoice::Portable,
    );
    for (name, k, n) in MODEL_SHAPES {
        for m in [1, 16] {
            w8a8(
                format!("w8a8 {name} {m}x{k}x{n}"),
                m,
                k,
                n,
                KernelChoice::Auto,
            );
        }
        // The float-activation decode kernels (no activation quantization) beside it.
        for (choice, suffix) in [
            (KernelChoice::FloatActivations, "float"),
            (KernelChoice::FloatActivationsSimt, "float-simt"),
        ] {
            w8a8(format!("w8a8 {name} 1x{k}x{n} {suffix}"), 1, k, n, choice);
        }
    }
    // e4m3 x e4m3 on operands quantized beforehand (the layer's weight, a quantized activation).
    for (m, choice, suffix) in [
        (4096, KernelChoice::Auto, ""),
        (512, KernelChoice::Auto, ""),
        (512, KernelChoice::Portable, " simt"),
    ] {
        let (name, k, n) = (format!("fp8_gemm {m}x4096x4096{suffix}"), 4096, 4096);
        let x = DeviceTensor::from_f32(client, &pseudo_random(m * k, 3), &[m, k], dtype).unwrap();
        let (qa, sa) = quant::quantize_per_row(client, &x, QuantFormat::Fp8E4M3).unwrap();
        let w = DeviceTensor::from_f32(client, &pseudo_random(n * k, 4), &[n, k], dtype).unwrap();
        let (qb, sb) = quant::quantize_per_row(client, &w, QuantFormat::Fp8E4M3).unwrap();
        let y = DeviceTensor::empty(client, &[m, n], dtype);
        out.push(Case {
            name,
            dtype,
            bytes: (m * k + n * k) as f64 + e * (m * n) as f64,
            flops: 2.0 * (m * n * k) as f64,
            run: Box::new(move || {
                gemm8_into(client, &qa, &sa, &qb, &sb, None, &y, choice).unwrap()
            }),
        });
    }
    // W4A16 (group 128): decode shapes against this run's bf16 GEMVs, and M = 512 and 4096
    // against cuBLAS bf16 at the same shape (the dense product the int4 layer replaces).
    let mut w4a16 = |name: String, m: usize, k: usize, n: usize| {
        let w = pseudo_random(n * k, 7);
        let mut layer = Rotation::new(copies(m, n * k / 2), || {
            W4A16Linear::from_dense(client, &w, [n, k], dtype, Some(128)).expect("bench weight")
        });
        let x = DeviceTensor::from_f32(client, &pseudo_random(m * k, 8), &[m, k], dtype).unwrap();
        let y = DeviceTensor::empty(client, &[m, n], dtype);
        out.push(Case {
            name,
            dtype,
            bytes: e * (m * k + m * n) as f64 + (n * k / 2 + 4 * n * k / 128) as f64,
            flops: 2.0 * (m * n * k) as f64,
            run: Box::new(move || {
                let e = Epilogue::NONE;
                layer.next().forward_into(client, &x, e, &y, None).unwrap()
            }),
        });
    };
    for m in [512, 4096] {
        w4a16(format!("w4a16 {m}x4096x4096"), m, 4096, 4096);
    }
    for (name, k, n) in MODEL_SHAPES {
        for m in [1, 16] {
            w4a16(format!("w4a16 {name} {m}x{k}x{n}"), m, k, n);
        }
    }
    // The FP8 layer at decode (activation quantization included), and on the float activation.
    for ((name, k, n), (choice, suffix)) in MODEL_SHAPES.into_iter().flat_map(|s| {
        [
            (KernelChoice::Auto, ""),
            (KernelChoice::FloatActivations, " float"),
            (KernelChoice::FloatActivationsSimt, " float-simt"),
        ]
        .map(|c| (s, c))
    }) {
        let w = pseudo_random(n * k, 5);
        let mut layer = Rotation::new(copies(1, n * k), || {
            Fp8Linear::from_dense(client, &w, [n, k], dtype)
                .expect("bench weight")
                .with_kernel(choice)
        });
        let x = DeviceTensor::from_f32(client, &pseudo_random(k, 6), &[1, k], dtype).unwrap();
        let y = DeviceTensor::empty(client, &[1, n], dtype);
        let ws = LinearWorkspace::new(client, 1, k, n, dtype);
        out.push(Case {
            name: format!("fp8 {name} 1x{k}x{n}{suffix}"),
            dtype,
            bytes: e * (k + n) as f64 + (n * k + 4 * n) as f64,
            flops: 2.0 * (n * k) as f64,
            run: Box::new(move || {
                let e = Epilogue::NONE;
                layer
                    .next()
                    .forward_into(client, &x, e, &y, Some(&ws))
                    .unwrap()
            }),
        });
    }
    // The two halves of an 8-bit decode projection apart: the activation quantization pre-pass
    // and the skinny GEMM on pre-quantized operands.
    for fmt in [QuantFormat::Int8, QuantFormat::Fp8E4M3] {
        let tag = if fmt == QuantFormat::Int8 {
            "int8"
        } else {
            "fp8"
        };
        for k in [1536, 8960] {
            let x = DeviceTensor::from_f32(client, &pseudo_random(k, 9), &[1, k], dtype).unwrap();
            out.push(Case {
                name: format!("quantize_per_row {tag} 1x{k}"),
                dtype,
                bytes: (e + 1.0) * k as f64,
                flops: 0.0,
                run: Box::new(move || {
                    quant::quantize_per_row(client, &x, fmt).unwrap();
                }),
            });
        }
        let (k, n) = (8960, 1536);
        let x = DeviceTensor::from_f32(client, &pseudo_random(k, 10), &[1, k], dtype).unwrap();
        let (qa, sa) = quant::quantize_per_row(client, &x, fmt).unwrap();
        let w = DeviceTensor::from_f32(client, &pseudo_random(n * k, 11), &[n, k], dtype).unwrap();
        let mut wq = Rotation::new(copies(1, n * k), || {
            quant::quantize_per_row(client, &w, fmt).unwrap()
        });
        let y = DeviceTensor::empty(client, &[1, n], dtype);
        out.push(Case {
            name: format!("gemm8 {tag} 1x{k}x{n}"),
            dtype,
            bytes: (k + n * k) as f64 + e * n as f64,
            flops: 2.0 * (n * k) as f64,
            run: Box::new(move || {
                let (qb, sb) = wq.next();
                gemm8_into(client, &qa, &sa, qb, sb, None, &y, KernelChoice::Auto).unwrap()
            }),
        });
    }
    out
}
