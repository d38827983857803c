//! Cases for `sparse::bsr_linear` on a grid of 1024 x 1024 and 4096 x 4096 weights, block 32,
//! block sparsity 50 / 70 / 90 %, M = 16, 256, 4096, f16, with the same names as the
//! PyTorch peers in `scripts/bench_torch.py` (dense `F.linear` and `F.linear` on a BSR weight).
//!
//! Weights are pseudo-random and pruned by block L2 norm, which for i.i.d. values drops blocks
//! uniformly at random, like the peers' random block masks. Bytes are the ones the op must move
//! (x, the stored blocks, y); flops count only the stored blocks.

use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};
use sparse::{bsr_linear_into, bsr_linear_into_tuned, Bsr, Tuning};

use super::Case;

const BLOCK: usize = 32;
pub const SHAPES: [(usize, usize); 2] = [(1024, 1024), (4096, 4096)];
pub const SPARSITIES: [usize; 3] = [50, 70, 90];
pub const ROWS: [usize; 3] = [16, 256, 4096];

/// Deterministic values in [-1, 1] (xorshift), so that runs are comparable.
fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

struct Setup<R: Runtime> {
    name: String,
    w: Bsr<R>,
    x: DeviceTensor<R>,
    out: DeviceTensor<R>,
    bytes: f64,
    flops: f64,
}

fn setups<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    shapes: &[(usize, usize)],
    sparsities: &[usize],
    rows: &[usize],
) -> Vec<Setup<R>> {
    let mut out = Vec::new();
    for &(n, k) in shapes {
        let dense = pseudo_random(n * k, (n * k) as u64);
        let xs: Vec<(usize, DeviceTensor<R>)> = rows
            .iter()
            .map(|&m| {
                let x =
                    DeviceTensor::from_f32(client, &pseudo_random(m * k, m as u64), &[m, k], dtype)
                        .expect("bench input");
                (m, x)
            })
            .collect();
        for &sp in sparsities {
            let w = Bsr::prune_from_dense(client, &dense, [n, k], BLOCK, sp as f64 / 100.0, dtype)
                .expect("bench weight");
            let stored = (w.nnz_blocks() * BLOCK * BLOCK) as f64;
            for (m, x) in &xs {
                let m = *m;
                let e = dtype.size() as f64;
                out.push(Setup {
                    name: format!("bsr_linear {n}x{k} s{sp} m{m}"),
                    w: w.clone(),
                    x: x.clone(),
                    out: DeviceTensor::empty(client, &[m, n], dtype),
                    bytes: e * ((m * k + m * n) as f64 + stored),
                    flops: 2.0 * m as f64 * stored,
                });
            }
        }
    }
    out
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let dtype = DType::F16;
    if !caps::supports_dtype(client, dtype) {
        return Vec::new();
    }
    setups(client, dtype, &SHAPES, &SPARSITIES, &ROWS)
        .into_iter()
        .map(|s| {
            let Setup {
                name,
                w,
                x,
                out,
                bytes,
                flops,
            } = s;
            Case {
                name,
                dtype,
                bytes,
                flops,
                run: Box::new(move || bsr_linear_into(client, &x, &w, None, &out).unwrap()),
            }
        })
        .collect()
}

/// Launch-shape sweep: the benchmark cases whose names contain one of `filters`, with the launch
/// shapes that make sense for their M forced, to pick the defaults of
/// `sparse::linear::blueprint`. Names carry `tm<rows> g<k_groups> b<group_blocks> db<0|1>
/// st<stages>` (`st0`: register staging; else a `cp.async` pipeline of that depth). Not a
/// `cubellm bench` family (too many cases for a routine run): `lab sparse-tune` runs it.
pub fn tune_cases<'a, R: Runtime>(client: &'a ComputeClient<R>, filters: &[&str]) -> Vec<Case<'a>> {
    let dtype = DType::F16;
    if !caps::supports_dtype(client, dtype) {
        return Vec::new();
    }
    let mut cases = Vec::new();
    let all = setups(client, dtype, &SHAPES, &SPARSITIES, &ROWS);
    for s in all
        .into_iter()
        .filter(|s| filters.iter().any(|f| s.name.contains(f)))
    {
        let m = s.x.shape()[0];
        let (tiles, groups, group_blocks): (&[usize], &[usize], &[usize]) = if m <= 16 {
            (&[16], &[2, 4, 8], &[1, 2, 4])
        } else if m <= 256 {
            (&[32, 64], &[1, 2, 4], &[1, 2])
        } else {
            (&[64, 128, 256], &[1, 2], &[1, 2, 4])
        };
        for &tile_m in tiles {
            for &k_groups in groups {
                for &gb in group_blocks {
                    // Register staging with two or one buffers, then cp.async pipelines of
                    // 2-4 stages (refused below where the runtime has no async copies).
                    for (db, stages) in [(true, 0), (false, 0), (true, 2), (true, 3), (true, 4)] {
                        let tuning = Tuning {
                            tile_m: Some(tile_m),
                            k_groups: Some(k_groups),
                            group_blocks: Some(gb),
                            double_buffer: Some(db),
                            stages: Some(stages),
                        };
                        // Only shapes the kernel accepts (a refused one is skipped, not timed).
                        if bsr_linear_into_tuned(client, &s.x, &s.w, None, &s.out, tuning).is_err()
                        {
                            continue;
                        }
                        let (x, w, out) = (s.x.clone(), s.w.clone(), s.out.clone());
                        cases.push(Case {
                            name: format!(
                                "{} tm{tile_m} g{k_groups} b{gb} db{} st{stages}",
                                s.name, db as u8
                            ),
                            dtype,
                            bytes: s.bytes,
                            flops: s.flops,
                            run: Box::new(move || {
                                bsr_linear_into_tuned(client, &x, &w, None, &out, tuning).unwrap()
                            }),
                        });
                    }
                }
            }
        }
    }
    cases
}
