//! Cases for `ops::attention` at the 1.5B model's heads (12 query / 2 KV heads of 128): causal
//! prefill at growing lengths (TFLOP/s, counting the causal half) and decode over a cache
//! (GB/s of K/V read once).

use cubecl::prelude::*;
use ops::attention::{attention_cached_into, attention_into, AttentionWorkspace, KvLen};
use ops::{caps, DType, DeviceTensor};

use super::Case;

const HQ: usize = 12;
const HKV: usize = 2;
const D: usize = 128;

fn filled<R: Runtime>(client: &ComputeClient<R>, shape: &[usize], dtype: DType) -> DeviceTensor<R> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    DeviceTensor::from_f32(client, &data, shape, dtype).unwrap()
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    let scale = 1.0 / (D as f32).sqrt();
    for dtype in [DType::BF16, DType::F16] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let e = dtype.size() as f64;
        for l in [512usize, 2048, 8192] {
            let q = filled(client, &[l, HQ, D], dtype);
            let k = filled(client, &[l, HKV, D], dtype);
            let v = filled(client, &[l, HKV, D], dtype);
            let o = DeviceTensor::empty(client, &[l, HQ, D], dtype);
            out.push(Case {
                name: format!("prefill causal L{l}"),
                dtype,
                bytes: e * (2 * l * HQ * D + 2 * l * HKV * D) as f64,
                // Two matmuls of Lq x Lk x D per head, half of them masked.
                flops: 2.0 * 2.0 * (HQ * l * l * D) as f64 / 2.0,
                run: Box::new(move || attention_into(client, &q, &k, &v, scale, true, &o).unwrap()),
            });
        }
        for lk in [1024usize, 4096, 32768] {
            let q = filled(client, &[1, HQ, D], dtype);
            let kc = filled(client, &[lk, HKV, D], dtype);
            let vc = filled(client, &[lk, HKV, D], dtype);
            let o = DeviceTensor::empty(client, &[1, HQ, D], dtype);
            let len = DeviceTensor::from_slice(client, &[lk as u32], &[1]).unwrap();
            let ws = AttentionWorkspace::for_shapes(client, 1, HQ, HKV, D, lk);
            out.push(Case {
                name: format!("decode Lk{lk}"),
                dtype,
                bytes: e * (2 * lk * HKV * D + 2 * HQ * D) as f64,
                flops: 4.0 * (HQ * lk * D) as f64,
                run: Box::new(move || {
                    attention_cached_into(
                        client,
                        &q,
                        &kc,
                        &vc,
                        KvLen::Device(&len),
                        scale,
                        &o,
                        Some(&ws),
                    )
                    .unwrap()
                }),
            });
        }
    }
    out
}
