//! Cases for the memory-bound core ops (`ops::{elementwise, softmax, rope, embedding, argmax}`):
//! a 4096 x 4096 tensor and the 1.5B model's shapes (hidden 1536, 12 heads of 128,
//! vocab 151936) at prefill (512 tokens) and decode (1 token).

use cubecl::prelude::*;
use ops::rope::RopeCache;
use ops::{caps, DType, DeviceTensor};

use super::Case;

/// `v` times standard normal values (seeded by the shape, so that operands differ).
fn filled<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &[usize],
    dtype: DType,
    v: f32,
) -> DeviceTensor<R> {
    let seed = shape.iter().fold(v.to_bits() as u64, |s, &d| {
        s.wrapping_mul(31).wrapping_add(d as u64)
    });
    super::randn_tensor(client, shape, dtype, v, seed)
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let e = dtype.size() as f64;
        for (rows, n) in [(4096usize, 4096usize), (1, 8960)] {
            let a = filled(client, &[rows, n], dtype, 0.5);
            let b = filled(client, &[rows, n], dtype, 0.25);
            let o = DeviceTensor::empty(client, &[rows, n], dtype);
            let bytes = e * (3 * rows * n) as f64;
            let (a2, b2, o2) = (a.clone(), b.clone(), o.clone());
            out.push(Case {
                name: format!("add {rows}x{n}"),
                dtype,
                bytes,
                flops: 0.0,
                run: Box::new(move || ops::elementwise::add_into(client, &a2, &b2, &o2).unwrap()),
            });
            let (a2, b2, o2) = (a.clone(), b.clone(), o.clone());
            out.push(Case {
                name: format!("swiglu {rows}x{n}"),
                dtype,
                bytes,
                flops: 0.0,
                run: Box::new(move || {
                    ops::elementwise::swiglu_into(client, &a2, &b2, &o2).unwrap()
                }),
            });
            out.push(Case {
                name: format!("softmax {rows}x{n}"),
                dtype,
                bytes: e * (2 * rows * n) as f64,
                flops: 0.0,
                run: Box::new(move || ops::softmax::softmax_into(client, &a, &o).unwrap()),
            });
        }
        // RoPE on q at the model's shape, and on a 4096 x 4096 activation seen as 32 heads of 128.
        let cache = RopeCache::new(client, 4096, 128, 10000.0).unwrap();
        for (t, h) in [(4096usize, 32usize), (512, 12), (1, 12)] {
            let x = filled(client, &[t, h, 128], dtype, 0.5);
            let o = DeviceTensor::empty(client, &[t, h, 128], dtype);
            let pos_host: Vec<u32> = (0..t as u32).collect();
            let pos = DeviceTensor::from_slice(client, &pos_host, &[t]).unwrap();
            let cache = cache.clone();
            out.push(Case {
                name: format!("rope {t}x{h}x128"),
                dtype,
                bytes: e * (2 * t * h * 128) as f64 + 4.0 * (t * 128) as f64,
                flops: 0.0,
                run: Box::new(move || ops::rope::rope_into(client, &x, &pos, &cache, &o).unwrap()),
            });
        }
        for (s, heads) in [(4096usize, 32usize), (512, 12)] {
            let hidden = heads * 128;
            let x = filled(client, &[1, s, hidden], dtype, 0.5);
            let w = filled(client, &[hidden], dtype, 1.0);
            let cs = filled(client, &[s, 128], dtype, 0.7);
            let o = DeviceTensor::empty(client, &[1, s, hidden], dtype);
            out.push(Case {
                name: format!("fused_rmsnorm_rope {s}x{hidden}"),
                dtype,
                bytes: e * (2 * s * hidden + 2 * s * 128 + hidden) as f64,
                flops: 0.0,
                run: Box::new(move || {
                    ops::rope::fused_rmsnorm_rope_into(client, &x, &w, &cs, &cs, 1e-6, None, &o)
                        .unwrap()
                }),
            });
        }
        // Embedding gather and argmax at the 1.5B model's vocabulary.
        let table = filled(client, &[151_936, 1536], dtype, 0.1);
        for t in [512usize, 1] {
            let ids_host: Vec<u32> = (0..t as u32).map(|i| i * 97 % 151_936).collect();
            let ids = DeviceTensor::from_slice(client, &ids_host, &[t]).unwrap();
            let o = DeviceTensor::empty(client, &[t, 1536], dtype);
            let table = table.clone();
            out.push(Case {
                name: format!("embedding {t}x1536"),
                dtype,
                bytes: e * (2 * t * 1536) as f64,
                flops: 0.0,
                run: Box::new(move || {
                    ops::embedding::embedding_into(client, &table, &ids, &o).unwrap()
                }),
            });
        }
        let logits = filled(client, &[1, 151_936], dtype, 0.3);
        let idx = DeviceTensor::empty(client, &[1], DType::U32);
        out.push(Case {
            name: "argmax 1x151936".into(),
            dtype,
            bytes: e * 151_936.0,
            flops: 0.0,
            run: Box::new(move || ops::argmax::argmax_into(client, &logits, &idx).unwrap()),
        });
    }
    out
}
