//! Diagnostics for `add` at 4096 x 4096, the one memory-bound op that measured a few percent
//! behind PyTorch (docs/investigations/add.md). Cases, per dtype:
//! - `sync idle`, `add then sync`: the round trip to the device, alone and after one add (these
//!   two block, unlike every other case: they are the fixed cost a sample pays once);
//! - `add eager`, `add eager alloc` (allocating the output), `add eager rotate4` (four operand
//!   sets in turn, so nothing is reused from the L2), all on normal random operands like
//!   PyTorch's `randn`; `add eager pattern` on the short repeating pattern the core bench used
//!   to add (PyTorch has the same case, to separate the data's effect from the kernels');
//! - `add eager ptx`, `add eager ptx cs`, `add eager ptx st.cs`, `add eager ptx ld.cs` (CUDA):
//!   the add with its loads and stores as inline PTX, plain, streaming (`ld/st.global.cs`, evict
//!   first), or with only the stores or only the loads streaming (docs/investigations/add.md);
//! - `add eager u<units>p<vectors>`: other launch shapes (default hints); `idx3d`: the default
//!   shape indexed by CubeCL's 3-D `ABSOLUTE_POS` instead of the x axis alone (the control for
//!   the flat index, docs/investigations/add.md);
//! - `add eager 4096x1536`: a size whose operands stay in the L2 from one launch to the next;
//! - `add pair[ 4096x1536][ hint]`: per call, a default add on one operand set, then the add
//!   (default or hinted) on another: the hinted add after ordinary L2 traffic;
//! - `add graph x20 ...` (CUDA): 20 adds replayed from one CUDA graph (per-replay time), with
//!   each launch shape and on the pattern;
//! - `add packed off<bytes>`: the operands carved from one buffer at chosen offsets (whether the
//!   allocator's placement changes the DRAM throughput: it did not).
//!
//! `scripts/bench_torch.py --family addlab` times PyTorch the same ways under the same names.

use crate::add_variants::{add_into_with, AddHint, AddLaunch, ADD_LAUNCH};
use bench::{capture, randn_tensor, Case};
use cubecl::prelude::*;
use ops::elementwise::add_into;
use ops::{caps, DType, DeviceTensor};

/// Adds per graph replay in the `graph x20` cases.
pub const GRAPH_ADDS: usize = 20;

/// Byte offsets between the operands carved from one buffer: `b` starts `off` bytes after the
/// end of `a`, and `out` `off` bytes after the end of `b`.
const PACKED_OFFSETS: [u64; 5] = [0, 1024, 65_536, 1 << 20, (5 << 20) + 4096];

/// `v * (1 + (i % 7) / 100)`: the pattern the core bench added before it used random operands.
fn pattern(n: usize, v: f32) -> Vec<f32> {
    (0..n).map(|i| v * (1.0 + (i % 7) as f32 * 0.01)).collect()
}

/// The bytes `data` has on the device as `dtype`.
fn device_bytes<R: Runtime>(client: &ComputeClient<R>, data: &[f32], dtype: DType) -> Vec<u8> {
    let t = DeviceTensor::from_f32(client, data, &[data.len()], dtype).unwrap();
    t.to_bytes(client).unwrap()
}

/// `GRAPH_ADDS` adds of `a + b` into `o` captured as one CUDA graph (None off CUDA).
fn graph_case<'a, R: Runtime>(
    client: &'a ComputeClient<R>,
    name: String,
    operands: [&DeviceTensor<R>; 3],
    launch: AddLaunch,
    bytes: f64,
) -> Option<Case<'a>> {
    let dtype = operands[0].dtype();
    let [a, b, o] = operands.map(DeviceTensor::clone);
    let step = move || {
        for _ in 0..GRAPH_ADDS {
            add_into_with(client, &a, &b, &o, launch).unwrap();
        }
    };
    let graph = capture(client, step)?;
    Some(Case {
        name,
        dtype,
        bytes: bytes * GRAPH_ADDS as f64,
        flops: 0.0,
        // SAFETY: the graph's retained handles keep its buffers alive; nothing reallocates them.
        run: Box::new(move || unsafe { graph.replay() }),
    })
}

/// One eager add per call.
fn eager_case<'a, R: Runtime>(
    client: &'a ComputeClient<R>,
    name: String,
    operands: [&DeviceTensor<R>; 3],
    launch: AddLaunch,
    bytes: f64,
) -> Case<'a> {
    let dtype = operands[0].dtype();
    let [a, b, o] = operands.map(DeviceTensor::clone);
    Case {
        name,
        dtype,
        bytes,
        flops: 0.0,
        run: Box::new(move || add_into_with(client, &a, &b, &o, launch).unwrap()),
    }
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    let (rows, n) = (4096usize, 4096usize);
    for dtype in [DType::F16, DType::F32, DType::BF16] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let e = dtype.size();
        let bytes = (3 * rows * n * e) as f64;
        let a_bytes = device_bytes(client, &bench::randn(rows * n, 1), dtype);
        let b_bytes = device_bytes(client, &bench::randn(rows * n, 2), dtype);
        let upload = |bytes: &[u8]| DeviceTensor::from_bytes(client, bytes, &[rows, n], dtype);
        let a = upload(&a_bytes).unwrap();
        let b = upload(&b_bytes).unwrap();
        let o = DeviceTensor::empty(client, &[rows, n], dtype);
        let pa = DeviceTensor::from_f32(client, &pattern(rows * n, 0.5), &[rows, n], dtype);
        let pb = DeviceTensor::from_f32(client, &pattern(rows * n, 0.25), &[rows, n], dtype);
        let (pa, pb) = (pa.unwrap(), pb.unwrap());

        // The round trip to an idle device, and one add followed by a wait for it: the fixed
        // cost a sample pays once (not a queued op: these two block).
        out.push(Case {
            name: "sync idle".into(),
            dtype,
            bytes: 0.0,
            flops: 0.0,
            run: Box::new(move || bench::sync(client)),
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
                    bench::sync(client)
                }),
            });
        }
        out.push(eager_case(
            client,
            "add eager".into(),
            [&a, &b, &o],
            ADD_LAUNCH,
            bytes,
        ));
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
        let name = "add eager pattern".to_string();
        out.push(eager_case(client, name, [&pa, &pb, &o], ADD_LAUNCH, bytes));
        let shape = |units, per_unit| AddLaunch {
            units,
            per_unit,
            ..ADD_LAUNCH
        };
        let hint = |hint| AddLaunch { hint, ..ADD_LAUNCH };
        let idx3d = AddLaunch {
            flat_index: false,
            ..ADD_LAUNCH
        };
        let mut shapes = vec![
            ("", ADD_LAUNCH),
            (" idx3d", idx3d),
            (" u128p1", shape(128, 1)),
            (" u256p1", shape(256, 1)),
            (" u1024p1", shape(1024, 1)),
            (" u256p4", shape(256, 4)),
        ];
        if caps::runtime_name(client).contains("cuda") {
            shapes.extend([
                (" ptx", hint(AddHint::Ptx)),
                (" ptx cs", hint(AddHint::Stream)),
                (" ptx st.cs", hint(AddHint::StreamStores)),
                (" ptx ld.cs", hint(AddHint::StreamLoads)),
            ]);
        }
        for &(suffix, launch) in &shapes {
            if !suffix.is_empty() {
                let name = format!("add eager{suffix}");
                out.push(eager_case(client, name, [&a, &b, &o], launch, bytes));
            }
            let name = format!("add graph x{GRAPH_ADDS}{suffix}");
            out.extend(graph_case(client, name, [&a, &b, &o], launch, bytes));
        }
        let name = format!("add graph x{GRAPH_ADDS} pattern");
        out.extend(graph_case(client, name, [&pa, &pb, &o], ADD_LAUNCH, bytes));

        // Four operand sets used in turn (384 MB at f16): nothing of one launch's operands is
        // still in the L2 when they come round again, as in a model where every add is new.
        let sets: Vec<[DeviceTensor<R>; 3]> = (0..4)
            .map(|_| {
                let o = DeviceTensor::empty(client, &[rows, n], dtype);
                [upload(&a_bytes).unwrap(), upload(&b_bytes).unwrap(), o]
            })
            .collect();
        let sets = std::rc::Rc::new(sets);
        // The rotating and L2-resident cases compare the default with the 3-D index, 128-unit
        // cubes and streaming hints.
        let compared: Vec<_> = shapes
            .iter()
            .filter(|(suffix, _)| matches!(*suffix, "" | " idx3d" | " u128p1" | " ptx cs"))
            .copied()
            .collect();
        for &(suffix, launch) in &compared {
            let sets = sets.clone();
            let mut next = 0usize;
            out.push(Case {
                name: format!("add eager rotate4{suffix}"),
                dtype,
                bytes,
                flops: 0.0,
                run: Box::new(move || {
                    let [a, b, o] = &sets[next % sets.len()];
                    next += 1;
                    add_into_with(client, a, b, o, launch).unwrap()
                }),
            });
        }

        // A size whose three operands (36 MB at f16) fit in the 50 MB L2 of an H100: the case
        // where evict-first hints could cost the reuse a loop of the same add gets.
        let (rows_l2, n_l2) = (4096usize, 1536usize);
        let l2 = [(); 3].map(|_| randn_tensor(client, &[rows_l2, n_l2], dtype, 1.0, 3));
        let l2_bytes = (3 * rows_l2 * n_l2 * e) as f64;
        for &(suffix, launch) in &compared {
            let name = format!("add eager {rows_l2}x{n_l2}{suffix}");
            let [a, b, o] = &l2;
            out.push(eager_case(client, name, [a, b, o], launch, l2_bytes));
        }

        // Pairs: a default add on one operand set, then the candidate on another, per call. The
        // first leaves ordinary (not evict-first) lines in the L2, as the other ops of a model
        // do, so a hinted candidate cannot lean on its own lines from the launch before.
        let l2_other = [(); 3].map(|_| randn_tensor(client, &[rows_l2, n_l2], dtype, 1.0, 4));
        let pair_sets = [
            ("", [&a, &b, &o], sets[0].each_ref(), bytes),
            (" 4096x1536", l2_other.each_ref(), l2.each_ref(), l2_bytes),
        ];
        for (size, first, second, pair_bytes) in pair_sets {
            for &(suffix, launch) in &compared {
                let first = first.map(DeviceTensor::clone);
                let second = second.map(DeviceTensor::clone);
                out.push(Case {
                    name: format!("add pair{size}{suffix}"),
                    dtype,
                    bytes: 2.0 * pair_bytes,
                    flops: 0.0,
                    run: Box::new(move || {
                        let [a, b, o] = &first;
                        add_into(client, a, b, o).unwrap();
                        let [a, b, o] = &second;
                        add_into_with(client, a, b, o, launch).unwrap()
                    }),
                });
            }
        }

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
            let (va, vb, vo) = (view(0), view(len + off), view(2 * len + 2 * off));
            va.write_bytes(client, &a_bytes).unwrap();
            vb.write_bytes(client, &b_bytes).unwrap();
            let name = format!("add packed off{off}");
            out.push(eager_case(client, name, [&va, &vb, &vo], ADD_LAUNCH, bytes));
        }
    }
    out
}
