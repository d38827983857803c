//! Family `lm-head` (run only when asked for by name): greedy decoding's LM head at the 1.5B
//! shape (1 536 → 151 936), as the decode step runs it, with the float head and its argmax
//! (`float`: the CUDA-core GEMV and the split argmax) and screened by an int8 copy (`screened`:
//! the SIMT 8-bit GEMV on the float activation, then `ops::argmax::screened`). Both write one
//! id. The weights are hashed random values (not a short period: rows must differ, or the
//! screen keeps every row equal to the largest).
//!
//! Bytes are the minimum each moves: the float head and its logits written and read once, or the
//! int8 copy (codes, scales, coefficients) and its approximations; the rows computed again are
//! not counted.

use cubecl::prelude::*;
use ops::argmax::screened::{screened_argmax_into, ScreenScratch, Screened};
use ops::gemm::SplitScratch;
use ops::linear::{Epilogue, Linear, LinearWorkspace};
use ops::{caps, DType, DeviceTensor};

use super::Case;

const K: usize = 1536;
const N: usize = 151_936;

/// `n` values in `[-scale, scale)` from a 64-bit mix of the index and `seed`.
fn hashed(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = (i ^ (seed << 40)).wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let dtype = if caps::supports_dtype(client, DType::BF16) {
        DType::BF16
    } else {
        DType::F16
    };
    let e = dtype.size() as f64;
    // On wgpu the page size is the storage-buffer binding limit, a hard limit on one buffer; on
    // CUDA it is only the size of the memory pools' pages.
    let head_bytes = (N * K * dtype.size()) as u64;
    let runtime = caps::runtime_name(client);
    if runtime != "cuda" && head_bytes > client.properties().memory.max_page_size {
        eprintln!(
            "lm-head: the {} MB head is larger than one buffer may be on the {} runtime; skipped",
            head_bytes / 1_000_000,
            runtime
        );
        return Vec::new();
    }
    // A final norm's output (unit RMS, times a weight near 1) and head rows of about 0.02.
    let x = DeviceTensor::from_f32(client, &hashed(K, 1, 1.7), &[1, K], dtype).unwrap();
    let w = DeviceTensor::from_f32(client, &hashed(N * K, 2, 0.035), &[N, K], dtype).unwrap();
    let logits = DeviceTensor::empty(client, &[1, N], dtype);
    let id = DeviceTensor::empty(client, &[1], DType::U32);
    let split = SplitScratch::new(client, ops::argmax::split_need(client, 1, N, dtype));
    let mut out = vec![{
        let (x, w, logits, id) = (x.clone(), w.clone(), logits.clone(), id.clone());
        Case {
            name: format!("lm_head greedy 1x{K}x{N} float"),
            dtype,
            bytes: e * (K + N * K + 2 * N) as f64,
            flops: 2.0 * (N * K) as f64,
            run: Box::new(move || {
                ops::matmul::linear_into(client, &x, &w, None, None, &logits).unwrap();
                ops::argmax::argmax_split_into(client, &logits, &id, &split).unwrap();
            }),
        }
    }];
    if quant::screen::can_screen(client, dtype, K) {
        let values = w.to_f32_vec(client).unwrap();
        let head = quant::screen::screening_head(client, &values, [N, K], dtype).unwrap();
        let ws = LinearWorkspace::new(client, 1, K, N, dtype);
        let scratch = ScreenScratch::new(client, N).unwrap();
        out.push(Case {
            name: format!("lm_head greedy 1x{K}x{N} screened"),
            dtype,
            bytes: e * (K + 2 * N) as f64 + (N * K + 8 * N) as f64,
            flops: 2.0 * (N * K) as f64,
            run: Box::new(move || {
                let approx = &logits;
                let e = Epilogue::NONE;
                head.linear
                    .forward_into(client, &x, e, approx, Some(&ws))
                    .unwrap();
                let s = Screened {
                    x: &x,
                    w: &w,
                    approx,
                    coef: &head.coef,
                };
                screened_argmax_into(client, s, &id, &scratch).unwrap();
            }),
        });
    }
    out
}
