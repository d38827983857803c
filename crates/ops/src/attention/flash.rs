//! Split-KV flash attention on CUDA cores (every runtime): one kernel serves decode (few query
//! rows, the KV range split across many cubes: flash-decoding) and prefill (query blocks, few
//! splits), followed by a small merge kernel.
//!
//! A cube owns one KV head, a block of `bq` query tokens (all `G = Hq / Hkv` query heads that
//! read this KV head, so K/V are read once for the whole group: GQA-aware) and one split of the
//! keys. It streams K/V in blocks of `bk` keys through shared memory (f32, rows padded by one
//! element against bank conflicts), keeps per-row online-softmax statistics (`max`, `sum`) and
//! an unnormalised f32 accumulator, and writes `(acc, max, sum)` for its split. The merge kernel
//! rescales the splits to the global max and normalises. Scores are never materialised beyond
//! one `rows x BK` block; key blocks entirely above the causal diagonal are skipped.

use cubecl::prelude::*;

/// Units per cube.
pub(crate) const UNITS: u32 = 128;
/// Query rows (tokens x heads of the group) a cube may own. With the K/V blocks below this
/// keeps the shared memory under 32 KB (the wgpu limit) for head dims up to 128.
pub(crate) const MAX_ROWS: u32 = 16;

/// Keys per shared-memory block for head dim `d` (halved above 128 to fit the same budget).
pub(crate) fn block_keys(d: usize) -> usize {
    if d > 128 {
        8
    } else {
        16
    }
}

/// Comptime shape of the split kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashPlan {
    /// Head dim (register and shared sizes depend on it).
    pub d: u32,
    /// Keys per shared-memory block ([`block_keys`]).
    pub bk: u32,
    pub causal: bool,
    pub len_from_device: bool,
}

/// Marks a masked score: exp() of it is never taken (the mask is explicit).
#[cube]
fn masked() -> f32 {
    f32::new(f32::MIN)
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_split_kernel<F: Float, N: Size>(
    q: &[F],
    k: &[Vector<F, N>],
    v: &[Vector<F, N>],
    kv_len_buf: &[u32],
    part_acc: &mut [f32],
    part_m: &mut [f32],
    part_l: &mut [f32],
    kv_len_host: usize,
    q_len: usize,
    hq: usize,
    hkv: usize,
    group: usize,
    bq: usize,
    keys_per_split: usize,
    splits: usize,
    scale: f32,
    #[comptime] plan: FlashPlan,
    #[define(F)] _dtype: ElemType,
) {
    let d = comptime![plan.d as usize];
    let dv = d / k[0].vector_size();
    let ks_stride = d + 1;
    let rows_max = comptime![MAX_ROWS as usize];
    let bk = comptime![plan.bk as usize];
    let units = comptime![UNITS as usize];

    let split = CUBE_POS_X as usize;
    let kvh = CUBE_POS_Y as usize % hkv;
    let qb = CUBE_POS_Y as usize / hkv;
    let t0 = qb * bq;
    let tokens = min(bq, q_len - t0);
    let rows = tokens * group;

    let mut kv_len = kv_len_host;
    if comptime![plan.len_from_device] {
        kv_len = kv_len_buf[0] as usize;
    }
    let start = split * keys_per_split;
    let mut end = min(start + keys_per_split, kv_len);
    if comptime![plan.causal] {
        // The last query of the block sees keys up to (t0 + tokens - 1) + kv_len - q_len.
        end = min(end, t0 + tokens + kv_len - q_len);
    }

    let mut qs = Shared::<[f32]>::new_slice(comptime![(MAX_ROWS * plan.d) as usize]);
    let mut ks = Shared::<[f32]>::new_slice(comptime![(plan.bk * (plan.d + 1)) as usize]);
    let mut vs = Shared::<[f32]>::new_slice(comptime![(plan.bk * plan.d) as usize]);
    let mut s = Shared::<[f32]>::new_slice(comptime![(MAX_ROWS * plan.bk) as usize]);
    let mut m_s = Shared::<[f32]>::new_slice(rows_max);
    let mut l_s = Shared::<[f32]>::new_slice(rows_max);
    let mut alpha_s = Shared::<[f32]>::new_slice(rows_max);

    // Row r = t_local * G + g reads query token t0 + t_local, head kvh * G + g.
    for idx in range_stepped(UNIT_POS as usize, rows * d, units) {
        let r = idx / d;
        let dd = idx % d;
        let t = t0 + r / group;
        let h = kvh * group + r % group;
        qs[idx] = f32::cast_from(q[(t * hq + h) * d + dd]) * scale;
    }
    if (UNIT_POS as usize) < rows_max {
        m_s[UNIT_POS as usize] = masked();
        l_s[UNIT_POS as usize] = 0f32;
    }
    let per_unit = comptime![(MAX_ROWS * plan.d).div_ceil(UNITS) as usize];
    let mut acc = Array::<f32>::new(per_unit);
    #[unroll]
    for i in 0..per_unit {
        acc[i] = 0f32;
    }
    sync_cube();

    for kb in range_stepped(start, end, bk) {
        // K/V block: 16-byte loads, converted to f32 in shared memory.
        for idx in range_stepped(UNIT_POS as usize, bk * dv, units) {
            let j = idx / dv;
            let c = idx % dv;
            let key = kb + j;
            let mut kv = Vector::<F, N>::new(F::new(0.0));
            let mut vv = Vector::<F, N>::new(F::new(0.0));
            if key < end {
                kv = k[(key * hkv + kvh) * dv + c];
                vv = v[(key * hkv + kvh) * dv + c];
            }
            let n = kv.vector_size();
            #[unroll]
            for l in 0..n {
                ks[j * ks_stride + c * n + l] = f32::cast_from(kv.extract(l));
                vs[j * d + c * n + l] = f32::cast_from(vv.extract(l));
            }
        }
        sync_cube();
        for idx in range_stepped(UNIT_POS as usize, rows * bk, units) {
            let r = idx / bk;
            let j = idx % bk;
            let key = kb + j;
            let t = t0 + r / group;
            let mut visible = key < end;
            if comptime![plan.causal] {
                visible = visible && key + q_len <= t + kv_len;
            }
            let mut dot = 0f32;
            if visible {
                for dd in 0..d {
                    dot += qs[r * d + dd] * ks[j * ks_stride + dd];
                }
            }
            s[idx] = select(visible, dot, masked());
        }
        sync_cube();
        if (UNIT_POS as usize) < rows {
            let r = UNIT_POS as usize;
            let m_old = m_s[r];
            let mut m_new = m_old;
            for j in 0..bk {
                m_new = max(m_new, s[r * bk + j]);
            }
            let mut sum = 0f32;
            for j in 0..bk {
                let sc = s[r * bk + j];
                let p = select(sc == masked(), 0f32, f32::exp(sc - m_new));
                s[r * bk + j] = p;
                sum += p;
            }
            let alpha = f32::exp(m_old - m_new);
            alpha_s[r] = alpha;
            l_s[r] = l_s[r] * alpha + sum;
            m_s[r] = m_new;
        }
        sync_cube();
        #[unroll]
        for i in 0..per_unit {
            let o = UNIT_POS as usize + i * units;
            if o < rows * d {
                let r = o / d;
                let dd = o % d;
                let mut a = acc[i] * alpha_s[r];
                for j in 0..bk {
                    a += s[r * bk + j] * vs[j * d + dd];
                }
                acc[i] = a;
            }
        }
        sync_cube();
    }

    let part = (qb * hkv + kvh) * splits + split;
    #[unroll]
    for i in 0..per_unit {
        let o = UNIT_POS as usize + i * units;
        if o < rows * d {
            part_acc[part * rows_max * d + o] = acc[i];
        }
    }
    if (UNIT_POS as usize) < rows {
        part_m[part * rows_max + UNIT_POS as usize] = m_s[UNIT_POS as usize];
        part_l[part * rows_max + UNIT_POS as usize] = l_s[UNIT_POS as usize];
    }
}

/// Combines the splits of each query row: one cube per (query token, query head), one unit per
/// element of the head dim.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_merge_kernel<F: Float>(
    part_acc: &[f32],
    part_m: &[f32],
    part_l: &[f32],
    out: &mut [F],
    q_len: usize,
    hq: usize,
    hkv: usize,
    group: usize,
    bq: usize,
    splits: usize,
    #[comptime] d: u32,
    #[define(F)] _dtype: ElemType,
) {
    let t = CUBE_POS / hq;
    let h = CUBE_POS % hq;
    let dd = UNIT_POS as usize;
    if t >= q_len || dd >= d as usize {
        terminate!();
    }
    let rows_max = comptime![MAX_ROWS as usize];
    let qb = t / bq;
    let r = (t % bq) * group + h % group;
    let kvh = h / group;
    let base = (qb * hkv + kvh) * splits;
    let mut m = f32::new(f32::MIN);
    for sp in 0..splits {
        m = max(m, part_m[(base + sp) * rows_max + r]);
    }
    let mut l = 0f32;
    let mut o = 0f32;
    for sp in 0..splits {
        let i = (base + sp) * rows_max + r;
        let w = f32::exp(part_m[i] - m);
        l += part_l[i] * w;
        o += part_acc[i * d as usize + dd] * w;
    }
    out[(t * hq + h) * d as usize + dd] = F::cast_from(o / l);
}
