//! Diagnostics for `add` at 4096 x 4096, the one memory-bound op that measured a few percent
//! behind PyTorch (BENCHMARKS.md, "The add investigation"). Cases, per dtype:
//! - `sync idle`, `add then sync`: the round trip to the device, alone and after one add (these
//!   two block, unlike every other case: they are the fixed cost a sample pays once);
//! - `add eager`, `add eager alloc` (allocating the output), `add eager randn` (normal-distributed
//!   operands like PyTorch's `randn`; the others add a short repeating pattern),
//!   `add eager rotate4` (four operand sets in turn, so nothing is reused from the L2);
//! - `add eager u<units>p<vectors>`: other launch shapes;
//! - `add graph x20 ...` (CUDA): 20 adds replayed from one CUDA graph (per-replay time);
//! - `add packed off<bytes>`: the operands carved from one buffer at chosen offsets (whether the
//!   allocator's placement changes the DRAM throughput: it did not).
//!
//! `scripts/bench_torch.py --family addlab` times PyTorch the same ways under the same names.

use cubecl::prelude::*;
use ops::elementwise::{add_into, add_into_with, AddLaunch, ADD_LAUNCH};
use ops::{caps, DType, DeviceTensor};

use super::Case;

/// Adds per graph replay in the `graph x20` cases.
pub const GRAPH_ADDS: usize = 20;

/// Byte offsets between the operands carved from one buffer: `b` starts `off` bytes after the
/// end of `a`, and `out` `off` bytes after the end of `b`.
const PACKED_OFFSETS: [u64; 5] = [0, 1024, 65_536, 1 << 20, (5 << 20) + 4096];

fn filled<R: Runtime>(client: &ComputeClient<R>, n: usize, dtype: DType, v: f32) -> Vec<u8> {
    let data: Vec<f32> = (0..n).map(|i| v * (1.0 + (i % 7) as f32 * 0.01)).collect();
    let t = DeviceTensor::from_f32(client, &data, &[n], dtype).unwrap();
    t.to_bytes(client).unwrap()
}

fn randn<R: Runtime>(client: &ComputeClient<R>, n: usize, dtype: DType, seed: u64) -> Vec<u8> {
    let t = super::randn_tensor(client, &[n], dtype, 1.0, seed);
    t.to_bytes(client).unwrap()
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    let (rows, n) = (4096usize, 4096usize);
    let cuda = caps::runtime_name(client).contains("cuda");
    for dtype in [DType::F16, DType::F32, DType::BF16] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let e = dtype.size();
        let bytes = (3 * rows * n * e) as f64;
        let a_bytes = filled(client, rows * n, dtype, 0.5);
        let b_bytes = filled(client, rows * n, dtype, 0.25);
        let a = DeviceTensor::from_bytes(client, &a_bytes, &[rows, n], dtype).unwrap();
        let b = DeviceTensor::from_bytes(client, &b_bytes, &[rows, n], dtype).unwrap();
        let o = DeviceTensor::empty(client, &[rows, n], dtype);
        {
            let (a, b, o) = (a.clone(), b.clone(), o.clone());
            out.push(Case {
                name: "add eager".into(),
                dtype,
                bytes,
                flops: 0.0,
                run: Box::new(move || add_into(client, &a, &b, &o).unwrap()),
            });
        }
        // The round trip to an idle device, and one add followed by a wait for it: the fixed
        // cost a sample pays once (not a queued op: these two block).
        out.push(Case {
            name: "sync idle".into(),
            dtype,
            bytes: 0.0,
            flops: 0.0,
            run: Box::new(move || super::sync(client)),
        });
        {
            let (a, b, o) = (a.clone(), b.clone(), o.clone());
            out.push(Case {
                name: "add then sync".into(),
                dtype,
                bytes,
                flops: 0.0,
                run: Box::new(move || {
                    add_into(client, &a, &b, &o).unwrap();
                    super::sync(client)
                }),
            });
        }
        {
            let (a, b) = (a.clone(), b.clone());
            out.push(Case {
                name: "add eager alloc".into(),
                dtype,
                bytes,
                flops: 0.0,
                run: Box::new(move || drop(ops::elementwise::add(client, &a, &b).unwrap())),
            });
        }
        let shape = |units, per_unit| AddLaunch { units, per_unit };
        let shapes = [
            ("".to_string(), ADD_LAUNCH),
            ("u128p1".into(), shape(128, 1)),
            ("u256p1".into(), shape(256, 1)),
            ("u1024p1".into(), shape(1024, 1)),
            ("u256p4".into(), shape(256, 4)),
        ];
        for (label, launch) in shapes {
            let suffix = if label.is_empty() {
                label
            } else {
                format!(" {label}")
            };
            if !suffix.is_empty() {
                let (a, b, o) = (a.clone(), b.clone(), o.clone());
                out.push(Case {
                    name: format!("add eager{suffix}"),
                    dtype,
                    bytes,
                    flops: 0.0,
                    run: Box::new(move || add_into_with(client, &a, &b, &o, launch).unwrap()),
                });
            }
            if !cuda {
                continue;
            }
            let step = {
                let (a, b, o) = (a.clone(), b.clone(), o.clone());
                move || {
                    for _ in 0..GRAPH_ADDS {
                        add_into_with(client, &a, &b, &o, launch).unwrap();
                    }
                }
            };
            if let Some(graph) = super::capture(client, step) {
                out.push(Case {
                    name: format!("add graph x{GRAPH_ADDS}{suffix}"),
                    dtype,
                    bytes: bytes * GRAPH_ADDS as f64,
                    flops: 0.0,
                    // SAFETY: the buffers the graph uses are kept alive by the graph's retained
                    // handles and by the clones above; nothing reallocates them.
                    run: Box::new(move || unsafe { graph.replay() }),
                });
            }
        }
        {
            let ra = randn(client, rows * n, dtype, 1);
            let rb = randn(client, rows * n, dtype, 2);
            let ra = DeviceTensor::from_bytes(client, &ra, &[rows, n], dtype).unwrap();
            let rb = DeviceTensor::from_bytes(client, &rb, &[rows, n], dtype).unwrap();
            let ro = DeviceTensor::empty(client, &[rows, n], dtype);
            {
                let (a, b, o) = (ra.clone(), rb.clone(), ro.clone());
                out.push(Case {
                    name: "add eager randn".into(),
                    dtype,
                    bytes,
                    flops: 0.0,
                    run: Box::new(move || add_into(client, &a, &b, &o).unwrap()),
                });
            }
            let step = move || {
                for _ in 0..GRAPH_ADDS {
                    add_into(client, &ra, &rb, &ro).unwrap();
                }
            };
            if let Some(graph) = super::capture(client, step) {
                out.push(Case {
                    name: format!("add graph x{GRAPH_ADDS} randn"),
                    dtype,
                    bytes: bytes * GRAPH_ADDS as f64,
                    flops: 0.0,
                    // SAFETY: as above.
                    run: Box::new(move || unsafe { graph.replay() }),
                });
            }
        }
        // Four operand sets used in turn (384 MB at f16): nothing of one launch's operands is
        // still in the L2 when they come round again, as in a model where every add is new.
        let sets: Vec<[DeviceTensor<R>; 3]> = (0..4)
            .map(|_| {
                [
                    DeviceTensor::from_bytes(client, &a_bytes, &[rows, n], dtype).unwrap(),
                    DeviceTensor::from_bytes(client, &b_bytes, &[rows, n], dtype).unwrap(),
                    DeviceTensor::empty(client, &[rows, n], dtype),
                ]
            })
            .collect();
        let mut next = 0usize;
        out.push(Case {
            name: "add eager rotate4".into(),
            dtype,
            bytes,
            flops: 0.0,
            run: Box::new(move || {
                let [a, b, o] = &sets[next % sets.len()];
                next += 1;
                add_into(client, a, b, o).unwrap()
            }),
        });
        let len = (rows * n * e) as u64;
        for off in PACKED_OFFSETS {
            let total = 3 * len + 2 * off;
            let buf = client.empty(total as usize);
            let view = |start: u64| {
                let h = buf
                    .clone()
                    .offset_start(start)
                    .offset_end(total - start - len);
                DeviceTensor::from_handle(h, &[rows, n], dtype)
            };
            let (pa, pb, po) = (view(0), view(len + off), view(2 * len + 2 * off));
            pa.write_bytes(client, &a_bytes).unwrap();
            pb.write_bytes(client, &b_bytes).unwrap();
            out.push(Case {
                name: format!("add packed off{off}"),
                dtype,
                bytes,
                flops: 0.0,
                run: Box::new(move || add_into(client, &pa, &pb, &po).unwrap()),
            });
        }
    }
    out
}
