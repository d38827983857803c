//! Cases for `ops::matmul`: prefill GEMMs (compute-bound: TFLOP/s) at square shapes (512..4096) and
//! the 1.5B model's, decode GEMVs (bandwidth-bound: GB/s of weight read) at the model's
//! projections with one and 16 rows (the CUDA-core GEMV beside the tensor-core one where both
//! run), and the fused gated MLP. [`cases_with`] forces a tensor-core tile on the cases
//! that run on tensor cores (tile sweeps: `cubellm bench --gemm-tile`).

use cubecl::prelude::*;
use ops::gemm::{SplitNeed, SplitScratch};
use ops::matmul::{
    fused_gated_mlp_into_with, fused_gated_mlp_opts_into, linear_into_with, linear_opts_into, plan,
    Activation, CmmaTile, GatedWeights, InputNorm, Kernel, MatmulStrategy, ProductOptions,
    TensorGemvShape, MAX_CUBE_SPLITS,
};
use ops::{caps, DType, DeviceTensor};

use super::Case;

/// The 1.5B model's projections as (name, K, N): qkv, o, gate_up, down, lm_head.
pub const MODEL_SHAPES: [(&str, usize, usize); 5] = [
    ("qkv", 1536, 2048),
    ("o", 1536, 1536),
    ("gate_up", 1536, 17920),
    ("down", 8960, 1536),
    ("lm_head", 1536, 151_936),
];

pub(crate) fn filled<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &[usize],
    dtype: DType,
) -> DeviceTensor<R> {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    DeviceTensor::from_f32(client, &data, shape, dtype).unwrap()
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    cases_with(client, None)
}

/// The strategy of a case of `m` rows: `tile` on the tensor-core GEMM where the case runs there
/// and the tile can run it (valid for the product, within the device's shared memory; else the
/// per-shape default, said on stderr), [`MatmulStrategy::Auto`] otherwise.
fn strategy<R: Runtime>(
    client: &ComputeClient<R>,
    tile: Option<CmmaTile>,
    name: &str,
    m: usize,
    dtype: DType,
    gated: bool,
) -> MatmulStrategy {
    let Some(tile) = tile else {
        return MatmulStrategy::Auto;
    };
    if plan(client, m, 16, dtype) != Kernel::TensorCore {
        return MatmulStrategy::Auto;
    }
    let smem = client.properties().hardware.max_shared_memory_size;
    if tile.is_valid(gated) && tile.shared_bytes(dtype.size(), gated) <= smem {
        MatmulStrategy::TensorCore(tile)
    } else {
        eprintln!("{name} {dtype}: tile {tile:?} cannot run it here; default tile");
        MatmulStrategy::Auto
    }
}

/// The cases, with those that run on the tensor-core GEMM forced onto `tile` when given and
/// when it can run them (else their default tile, said on stderr).
pub fn cases_with<R: Runtime>(client: &ComputeClient<R>, tile: Option<CmmaTile>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let e = dtype.size() as f64;
        let mut push =
            |name: String, m: usize, k: usize, n: usize, forced: Option<MatmulStrategy>| {
                let x = filled(client, &[m, k], dtype);
                let w = filled(client, &[n, k], dtype);
                let y = DeviceTensor::empty(client, &[m, n], dtype);
                let strategy =
                    forced.unwrap_or_else(|| strategy(client, tile, &name, m, dtype, false));
                out.push(Case {
                    name,
                    dtype,
                    bytes: e * (m * k + n * k + m * n) as f64,
                    flops: 2.0 * (m * n * k) as f64,
                    run: Box::new(move || {
                        linear_into_with(client, &x, &w, None, None, &y, strategy).unwrap()
                    }),
                });
            };
        for m in [512usize, 4096] {
            push(format!("gemm {m}x4096x4096"), m, 4096, 4096, None);
        }
        for (name, k, n) in MODEL_SHAPES {
            push(format!("gemm {name} 512x{k}x{n}"), 512, k, n, None);
        }
        // The decode products at one and 16 rows; where the tensor-core GEMV runs them, the
        // CUDA-core GEMV beside it ("gemv-fma").
        for m in [1usize, 16] {
            for (name, k, n) in MODEL_SHAPES {
                push(format!("gemv {name} {m}x{k}x{n}"), m, k, n, None);
                if plan(client, m, k, dtype) == Kernel::TensorGemv {
                    let fma = Some(MatmulStrategy::Gemv);
                    push(format!("gemv-fma {name} {m}x{k}x{n}"), m, k, n, fma);
                }
            }
        }
        for m in [1usize, 512] {
            let (h, i) = (1536usize, 8960usize);
            let x = filled(client, &[m, h], dtype);
            let w = filled(client, &[2 * i, h], dtype);
            let y = DeviceTensor::empty(client, &[m, i], dtype);
            let name = format!("gated_mlp {m}x{h}x{i}");
            let strategy = strategy(client, tile, &name, m, dtype, true);
            out.push(Case {
                name,
                dtype,
                bytes: e * (m * h + 2 * i * h + m * i) as f64,
                flops: 4.0 * (m * i * h) as f64,
                run: Box::new(move || {
                    fused_gated_mlp_into_with(
                        client,
                        &x,
                        GatedWeights::Concatenated(&w),
                        Activation::Silu,
                        &y,
                        strategy,
                    )
                    .unwrap()
                }),
            });
        }
    }
    out
}

/// Bytes of weight copies a sweep case cycles through: five times a 50 MB L2.
pub const SWEEP_WEIGHT_POOL: usize = 256 << 20;

/// The tensor-core GEMV's launch shapes on the 1.5B model's decode products at one and 16 rows,
/// bf16: `cubellm bench --family gemv-sweep`. For 4 and 8 vectors per lane and one or two
/// column tiles per plane, K is cut into slices of `32 · vectors` elements and spread over cubes
/// of about 4, 8 or 16 slices each (split across cubes through a scratch when K has more), plus
/// the scratch-less form whose planes loop over K, and [`TensorGemvShape::auto`]'s shape; at one
/// row also the CUDA-core GEMV with its own K split and each of 1, 2, 4 and 8. gate_up
/// runs as the model runs it, gated with the input norm; the others as plain products. Each case
/// cycles through copies of its weight filling [`SWEEP_WEIGHT_POOL`] bytes, so that the weights
/// stream from DRAM as in the decode step (one copy of qkv, o or down would stay in a 50 MB L2
/// and measure the cache instead).
pub fn gemv_sweep<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    use std::cell::Cell;
    use std::rc::Rc;
    let dtype = DType::BF16;
    let mut out = Vec::new();
    if !caps::supports_dtype(client, dtype) || plan(client, 16, 1536, dtype) != Kernel::TensorGemv {
        return out;
    }
    let e = dtype.size() as f64;
    let sms = caps::num_sms(client) as usize;
    for m in [1usize, 16] {
        for (name, k, n) in MODEL_SHAPES {
            let gated = name == "gate_up";
            let cols = if gated { n / 2 } else { n };
            let mut shapes = vec![TensorGemvShape::auto(cols, k, gated, sms, true)];
            for vectors in [4u32, 8] {
                for tiles in [1u32, 2] {
                    let slices = k.div_ceil(32 * vectors as usize);
                    let mut per_cube = vec![(slices.min(16), 1)];
                    for want in [4usize, 8, 16] {
                        let cubes = slices.div_ceil(want).min(MAX_CUBE_SPLITS as usize);
                        per_cube.push((slices.div_ceil(cubes).min(16), cubes));
                    }
                    for (splits, cube_splits) in per_cube {
                        let shape = TensorGemvShape {
                            splits: splits as u32,
                            vectors,
                            tiles,
                            cube_splits: cube_splits as u32,
                        };
                        if !shapes.contains(&shape) {
                            shapes.push(shape);
                        }
                    }
                }
            }
            let need = shapes.iter().fold(SplitNeed::default(), |a, s| {
                a.max(s.split_need(cols, gated, gated))
            });
            let x = filled(client, &[m, k], dtype);
            let copies = (SWEEP_WEIGHT_POOL / (n * k * dtype.size())).max(1);
            let w: Vec<DeviceTensor<R>> = (0..copies)
                .map(|_| filled(client, &[n, k], dtype))
                .collect();
            let g = filled(client, &[k], dtype);
            let normed = DeviceTensor::empty(client, &[m, k], dtype);
            let y = DeviceTensor::empty(client, &[m, cols], dtype);
            let split = SplitScratch::new(client, need);
            let (x, w, g, normed, y, split) = (
                Rc::new(x),
                Rc::new(w),
                Rc::new(g),
                Rc::new(normed),
                Rc::new(y),
                Rc::new(split),
            );
            let mut strategies: Vec<(String, MatmulStrategy)> = shapes
                .into_iter()
                .map(|shape| {
                    let TensorGemvShape {
                        splits: s,
                        vectors,
                        tiles,
                        cube_splits: c,
                    } = shape;
                    (
                        format!("s{s} v{vectors} t{tiles} c{c}"),
                        MatmulStrategy::TensorGemv(Some(shape)),
                    )
                })
                .collect();
            if m == 1 {
                // The CUDA-core GEMV, which one row runs on: its own choice and each K split.
                strategies.push(("gemv auto".to_string(), MatmulStrategy::Gemv));
                for s in [1u32, 2, 4, 8] {
                    strategies.push((format!("gemv s{s}"), MatmulStrategy::GemvSplit(s)));
                }
            }
            for (label, strategy) in strategies {
                let (x, ws, g, normed, y, split) = (
                    x.clone(),
                    w.clone(),
                    g.clone(),
                    normed.clone(),
                    y.clone(),
                    split.clone(),
                );
                let next = Cell::new(0usize);
                out.push(Case {
                    name: format!("sweep {name} {m}x{k}x{n} {label}"),
                    dtype,
                    bytes: e * (m * k + n * k + m * cols) as f64,
                    flops: 2.0 * (m * n * k) as f64,
                    run: Box::new(move || {
                        let w = &ws[next.get() % ws.len()];
                        next.set(next.get() + 1);
                        let opts = ProductOptions {
                            strategy,
                            split_k: Some(&*split),
                            rows_invariant: true,
                        };
                        if gated {
                            let norm = InputNorm {
                                weight: &g,
                                eps: 1e-6,
                            };
                            fused_gated_mlp_opts_into(
                                client,
                                &x,
                                Some((norm, &*normed)),
                                GatedWeights::Concatenated(w),
                                Activation::Silu,
                                &y,
                                opts,
                            )
                            .unwrap()
                        } else {
                            linear_opts_into(client, &x, None, w, None, None, &y, opts).unwrap()
                        }
                    }),
                });
            }
        }
    }
    out
}
