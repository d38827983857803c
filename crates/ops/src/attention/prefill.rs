//! Flash attention for many queries: query tiles per cube, K/V tiles streamed through shared
//! memory, online softmax, the `Lq x Lk` score matrix never materialised.
//!
//! Two kernels:
//! - [`tiled_kernel`]: portable (no plane ops, no tensor cores, any float dtype): what wgpu and
//!   f32 run, and what decodes on runtimes without plane ops. It also splits the keys across cubes
//!   (partials merged by [`super::decode::merge_kernel`]) so that few-query problems still fill
//!   the device.
//! - [`mma_kernel`]: CUDA tensor cores through CubeCL's manual `mma` (m16n8k16, f16/bf16 in, f32
//!   accumulate), FlashAttention-2 style: each plane owns 16 query rows, S = Q·Kᵀ and O += P·V stay
//!   in registers, P is re-packed from the accumulator layout into the A-operand layout without
//!   touching shared memory, K/V tiles are double-buffered with `cp.async`.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::barrier::{copy_async, Barrier};
use cubecl::prelude::*;

use crate::online_softmax::{exp_or_zero, EMPTY_MAX};

/// The comptime shape of [`tiled_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TiledConfig {
    /// Head dimension.
    pub d: usize,
    /// Rows (query, head-of-group pairs) per cube.
    pub br: usize,
    /// Keys per shared-memory tile.
    pub bk: usize,
    /// Units cooperating on one row (the cube has `br * upr` units).
    pub upr: usize,
    pub causal: bool,
    /// Read the KV length from a device buffer instead of the `len_host` argument.
    pub device_len: bool,
    /// Write unnormalised partials (one per key split) instead of the output.
    pub partial: bool,
}

impl TiledConfig {
    pub fn units(&self) -> u32 {
        (self.br * self.upr) as u32
    }

    /// Dimensions each unit accumulates (`d` spread over the `upr` units of a row).
    pub fn dims_per_unit(&self) -> usize {
        self.d.div_ceil(self.upr)
    }

    /// Shared memory of one cube, in bytes.
    pub fn shared_bytes(&self, elem: usize) -> usize {
        (self.br * self.d + 2 * self.bk * self.d) * elem + self.br * self.bk * 4
    }
}

/// The runtime geometry shared by the kernels: sizes, the KV length and the key split. Built in
/// the kernel from scalar arguments (see [`geometry`]).
#[derive(CubeType, Clone, Copy)]
pub(crate) struct Geometry {
    /// KV length when it is known on the host (ignored with a device length).
    pub len_host: u32,
    /// Queries per sequence.
    pub lq: u32,
    pub hq: u32,
    pub hkv: u32,
    /// Query heads per KV head.
    pub group: u32,
    /// Rows of the K/V buffers per sequence (`lk`, or `max_len` for a cache).
    pub kv_rows: u32,
    /// Keys per split (the whole range when there is one split).
    pub chunk: u32,
    pub splits: u32,
    /// Cubes along the row axis per (sequence, KV head).
    pub row_blocks: u32,
    pub scale: f32,
}

/// Packs the scalar launch arguments (the same list in every attention kernel).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn geometry(
    len_host: u32,
    lq: u32,
    hq: u32,
    hkv: u32,
    group: u32,
    kv_rows: u32,
    chunk: u32,
    splits: u32,
    row_blocks: u32,
    scale: f32,
) -> Geometry {
    Geometry {
        len_host,
        lq,
        hq,
        hkv,
        group,
        kv_rows,
        chunk,
        splits,
        row_blocks,
        scale,
    }
}

/// The KV length this launch works with: from the device buffer (clamped to the buffer's rows,
/// so a bad length can never read outside the cache) or from the host.
#[cube]
pub(crate) fn kv_len(len_buf: &[u32], geo: &Geometry, #[comptime] device_len: bool) -> u32 {
    let mut len = geo.len_host;
    if comptime![device_len] {
        len = min(len_buf[0], geo.kv_rows);
    }
    len
}

/// The number of keys query `i` sees: all `len` of them, or with the causal rule
/// (`j <= i + len - lq`) `i + 1 + len - lq` clamped to `[0, len]`.
#[cube]
pub(crate) fn visible_keys(i: u32, len: u32, lq: u32, #[comptime] causal: bool) -> u32 {
    let mut n = len;
    if comptime![causal] {
        n = min((i + 1 + len).saturating_sub(lq), len);
    }
    n
}

#[cube(launch_unchecked)]
pub(crate) fn tiled_kernel<F: Float>(
    q: &[F],
    k: &[F],
    v: &[F],
    len_buf: &[u32],
    out: &mut [F],
    part_acc: &mut [f32],
    part_stats: &mut [f32],
    len_host: u32,
    lq: u32,
    hq: u32,
    hkv: u32,
    group: u32,
    kv_rows: u32,
    chunk: u32,
    splits: u32,
    row_blocks: u32,
    scale: f32,
    #[comptime] cfg: TiledConfig,
    #[define(F)] _dtype: ElemType,
) {
    let geo = geometry(
        len_host, lq, hq, hkv, group, kv_rows, chunk, splits, row_blocks, scale,
    );
    let d = comptime![cfg.d];
    let br = comptime![cfg.br];
    let bk = comptime![cfg.bk];
    let upr = comptime![cfg.upr];
    let dpu = comptime![cfg.dims_per_unit()];

    let r = UNIT_POS as usize / upr;
    let sub = UNIT_POS as usize % upr;
    let hk = CUBE_POS_Y;
    let split = CUBE_POS_Z % geo.splits;
    let b = CUBE_POS_Z / geo.splits;
    let len = kv_len(len_buf, &geo, cfg.device_len);

    // This unit's row: (query i, head h of the group of KV head hk). Rows past the end compute
    // on a clamped copy and never write.
    let rows_total = geo.lq * geo.group;
    let rho = CUBE_POS_X * br as u32 + r as u32;
    let row_valid = rho < rows_total;
    let rho_c = min(rho, rows_total - 1);
    let i = rho_c / geo.group;
    let h = hk * geo.group + rho_c % geo.group;
    let rho_last = min(CUBE_POS_X * br as u32 + br as u32 - 1, rows_total - 1);

    // Keys of this split that some row of the cube can see; fully masked tiles are never loaded.
    let k_begin = split * geo.chunk;
    let split_end = min(k_begin + geo.chunk, len);
    let k_end = min(
        split_end,
        visible_keys(rho_last / geo.group, len, geo.lq, cfg.causal),
    );
    let row_end = min(split_end, visible_keys(i, len, geo.lq, cfg.causal));

    let mut q_sh = Shared::<[F]>::new_slice(comptime![br * d]);
    let mut k_sh = Shared::<[F]>::new_slice(comptime![bk * d]);
    let mut v_sh = Shared::<[F]>::new_slice(comptime![bk * d]);
    let mut s_sh = Shared::<[f32]>::new_slice(comptime![br * bk]);

    let q_base = ((b * geo.lq + i) * geo.hq + h) as usize * d;
    for dd in range_stepped(sub, d, upr) {
        q_sh[r * d + dd] = q[q_base + dd];
    }

    let mut acc = Array::<f32>::new(dpu);
    #[unroll]
    for t in 0..dpu {
        acc[t] = 0f32;
    }
    let mut m = f32::new(EMPTY_MAX);
    let mut l = 0f32;
    let empty = f32::new(EMPTY_MAX);
    let kv_stride = (geo.hkv as usize) * d;
    let kv_base = (b * geo.kv_rows) as usize * kv_stride + hk as usize * d;

    for kt in range_stepped(k_begin, k_end, bk as u32) {
        // Rows past the visible range are clamped to the last visible row: finite data whose
        // scores are masked below (a cache row past the length may hold anything, NaN included).
        for e in range_stepped(UNIT_POS as usize, comptime![bk * d], CUBE_DIM as usize) {
            let kk = e / d;
            let dd = e % d;
            let j = min(kt as usize + kk, k_end as usize - 1);
            k_sh[e] = k[kv_base + j * kv_stride + dd];
            v_sh[e] = v[kv_base + j * kv_stride + dd];
        }
        sync_cube();

        for kk in range_stepped(sub, bk, upr) {
            let mut s = 0f32;
            for dd in 0..d {
                s += f32::cast_from(q_sh[r * d + dd]) * f32::cast_from(k_sh[kk * d + dd]);
            }
            let j = kt + kk as u32;
            s_sh[r * bk + kk] = select(j < row_end, s * geo.scale, empty);
        }
        sync_cube();

        let mut m_tile = empty;
        for kk in 0..bk {
            m_tile = max(m_tile, s_sh[r * bk + kk]);
        }
        let m_new = max(m, m_tile);
        let alpha = exp_or_zero(m, m_new);
        l *= alpha;
        #[unroll]
        for t in 0..dpu {
            acc[t] *= alpha;
        }
        for kk in 0..bk {
            let s = s_sh[r * bk + kk];
            // A masked key contributes nothing.
            let p = exp_or_zero(s, m_new);
            l += p;
            #[unroll]
            for t in 0..dpu {
                let dd = sub + t * upr;
                if comptime![(t + 1) * upr <= d] || dd < d {
                    acc[t] += p * f32::cast_from(v_sh[kk * d + dd]);
                }
            }
        }
        m = m_new;
        sync_cube();
    }

    if row_valid {
        let orow = ((b * geo.lq + i) * geo.hq + h) as usize;
        if comptime![cfg.partial] {
            let rows_out = (CUBE_COUNT_Z / geo.splits * geo.lq * geo.hq) as usize;
            let prow = split as usize * rows_out + orow;
            #[unroll]
            for t in 0..dpu {
                let dd = sub + t * upr;
                if comptime![(t + 1) * upr <= d] || dd < d {
                    part_acc[prow * d + dd] = acc[t];
                }
            }
            if sub == 0 {
                part_stats[prow * 2] = m;
                part_stats[prow * 2 + 1] = l;
            }
        } else {
            // A row that sees no key (device length below lq) gets zeros.
            let inv = select(l > 0f32, 1f32 / l, 0f32);
            #[unroll]
            for t in 0..dpu {
                let dd = sub + t * upr;
                if comptime![(t + 1) * upr <= d] || dd < d {
                    out[orow * d + dd] = F::cast_from(acc[t] * inv);
                }
            }
        }
    }
}

/// The comptime shape of [`mma_kernel`]: `16 * warps` query rows and `bk` keys per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MmaConfigAttn {
    pub d: usize,
    /// Planes per cube; each owns 16 query rows.
    pub warps: usize,
    /// Keys per K/V tile.
    pub bk: usize,
    pub causal: bool,
    pub device_len: bool,
}

impl MmaConfigAttn {
    pub fn new(d: usize, causal: bool, device_len: bool) -> Self {
        Self {
            d,
            warps: 4,
            bk: 64,
            causal,
            device_len,
        }
    }

    /// Query rows per cube.
    pub fn bq(&self) -> usize {
        16 * self.warps
    }

    /// Shared-memory row stride in elements: 16 bytes of padding spread the 8 rows an `ldmatrix`
    /// reads over all 32 banks.
    pub fn stride(&self) -> usize {
        self.d + 8
    }

    pub fn shared_bytes(&self, elem: usize) -> usize {
        (self.bq() + 4 * self.bk) * self.stride() * elem + 64
    }
}

/// `2^x` with the hardware approximation (`ex2.approx.ftz.f32`: one MUFU instruction, relative
/// error about 2^-22, -huge gives +0). PTX: only [`mma_kernel`] uses it, and that kernel only runs
/// on CUDA.
#[cube]
pub(crate) fn exp2_approx(x: f32) -> f32 {
    let out: f32;
    gpu_asm!(
        "ex2.approx.ftz.f32 {o}, {i};",
        o = out(_) out,
        i = in(_) x,
        options(pure, nomem),
    );
    out
}

/// Queues `cp.async` copies of `rows` rows of `d` elements (16 bytes per copy) from `src`
/// (row `r` at `src_base + min(r, last) * src_stride`) into `dst` (row `r` at
/// `dst_base + r * dst_stride`). Rows past `last` repeat row `last`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_rows_async<F: Float>(
    src: &[F],
    dst: &mut [F],
    src_base: usize,
    src_stride: usize,
    last: usize,
    dst_base: usize,
    #[comptime] rows: usize,
    #[comptime] d: usize,
    #[comptime] dst_stride: usize,
) {
    let per_row = comptime![d / 8];
    for e in range_stepped(
        UNIT_POS as usize,
        comptime![rows * d / 8],
        CUBE_DIM as usize,
    ) {
        let r = e / per_row;
        let c = (e % per_row) * 8;
        let s = src_base + min(r, last) * src_stride + c;
        let t = dst_base + r * dst_stride + c;
        copy_async(&src[s..s + 8], &mut dst[t..t + 8], 8u32);
    }
}

#[cube(launch_unchecked)]
pub(crate) fn mma_kernel<F: Float>(
    q: &[F],
    k: &[F],
    v: &[F],
    len_buf: &[u32],
    out: &mut [F],
    len_host: u32,
    lq: u32,
    hq: u32,
    hkv: u32,
    group: u32,
    kv_rows: u32,
    row_blocks: u32,
    scale: f32,
    #[comptime] cfg: MmaConfigAttn,
    #[define(F)] _dtype: ElemType,
) {
    let geo = geometry(
        len_host, lq, hq, hkv, group, kv_rows, 0u32, 1u32, row_blocks, scale,
    );
    let d = comptime![cfg.d];
    let bk = comptime![cfg.bk];
    let bq = comptime![cfg.bq()];
    let stride = comptime![cfg.stride()];
    let dk = comptime![cfg.d / 16];
    let nk = comptime![cfg.bk / 8];
    let dn = comptime![cfg.d / 8];
    let kk_n = comptime![cfg.bk / 16];
    let empty = f32::new(EMPTY_MAX);

    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let size!(NA) = def.vector_size(MatrixIdent::A);
    let size!(NB) = def.vector_size(MatrixIdent::B);
    let size!(NC) = def.vector_size(MatrixIdent::Accumulator);

    let lane = UNIT_POS % 32;
    let warp = UNIT_POS / 32;
    let g = lane / 4;
    let t = lane % 4;
    // Causal blocks further down the sequence have more keys: start them first.
    let qb = geo.row_blocks - 1 - CUBE_POS_X;
    let h = CUBE_POS_Y;
    let b = CUBE_POS_Z;
    let hk = h / geo.group;
    let len = kv_len(len_buf, &geo, cfg.device_len);

    let row0 = qb * bq as u32;
    let last_row = min(row0 + bq as u32, geo.lq) - 1;
    // Keys the last row of the block sees (tiles past them are never loaded) and the first row
    // sees (tiles below it need no mask).
    let k_end = visible_keys(last_row, len, geo.lq, cfg.causal);
    let k_unmasked = visible_keys(row0, len, geo.lq, cfg.causal);
    let n_tiles = k_end.div_ceil(bk as u32);

    let mut q_sh = Shared::<[F]>::new_aligned_slice(comptime![bq * stride], 16usize);
    let mut k_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let mut v_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let bar0 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);
    let bar1 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let q_stride = (geo.hq as usize) * d;
    let q_base = (b * geo.lq) as usize * q_stride + h as usize * d;
    let kv_stride = (geo.hkv as usize) * d;
    let kv_base = (b * geo.kv_rows) as usize * kv_stride + hk as usize * d;
    let last_key = k_end.saturating_sub(1) as usize;

    copy_rows_async::<F>(
        q,
        &mut q_sh,
        q_base + row0 as usize * q_stride,
        q_stride,
        (last_row - row0) as usize,
        0usize,
        bq,
        d,
        stride,
    );
    if n_tiles > 0 {
        copy_rows_async::<F>(
            k, &mut k_sh, kv_base, kv_stride, last_key, 0usize, bk, d, stride,
        );
        copy_rows_async::<F>(
            v, &mut v_sh, kv_base, kv_stride, last_key, 0usize, bk, d, stride,
        );
    }
    bar0.commit_copy_async();
    bar0.arrive_and_wait();

    // Q fragments stay in registers for the whole key loop.
    let lrow = (lane % 8 + 8 * ((lane / 8) % 2)) as usize;
    let lcol = (8 * (lane / 16)) as usize;
    let mut q_frag = Array::<Vector<F, NA>>::new(comptime![dk * 4]);
    #[unroll]
    for c in 0..dk {
        let start = (warp as usize * 16 + lrow) * stride + c * 16 + lcol;
        let regs = def.load_matrix::<F, NA>(&q_sh[start..start + 8], MatrixIdent::A, 4usize, false);
        #[unroll]
        for r in 0..4usize {
            q_frag[c * 4 + r] = regs[r];
        }
    }

    let mut o_acc = Array::<Vector<f32, NC>>::new(comptime![dn * 2]);
    #[unroll]
    for n in 0..comptime![dn * 2] {
        o_acc[n] = Vector::new(0f32);
    }
    let mut s_acc = Array::<Vector<f32, NC>>::new(comptime![nk * 2]);
    let mut m0 = empty;
    let mut m1 = empty;
    let mut l0 = 0f32;
    let mut l1 = 0f32;
    let i0 = row0 + warp * 16 + g;
    let lim0 = visible_keys(i0, len, geo.lq, cfg.causal);
    let lim1 = visible_keys(i0 + 8, len, geo.lq, cfg.causal);
    // `scale * log2(e)` (the host passes it in place of the scale).
    let c = geo.scale;
    // Addresses this lane gives to ldmatrix for K (keys x dims) and V (keys x dims, transposed).
    let mk = (lane / 8) as usize;
    let k_lrow = 8 * (mk / 2) + (lane % 8) as usize;
    let k_lcol = 8 * (mk % 2);
    let v_lrow = 8 * (mk % 2) + (lane % 8) as usize;
    let v_lcol = 8 * (mk / 2);

    for kt in 0..n_tiles {
        let buf = (kt % 2) as usize;
        if kt + 1 < n_tiles {
            let nb = comptime![bk * stride] * (1 - buf);
            let first = ((kt + 1) * bk as u32) as usize;
            let src = kv_base + first * kv_stride;
            let last = last_key - first;
            copy_rows_async::<F>(k, &mut k_sh, src, kv_stride, last, nb, bk, d, stride);
            copy_rows_async::<F>(v, &mut v_sh, src, kv_stride, last, nb, bk, d, stride);
            if buf == 0 {
                bar1.commit_copy_async();
            } else {
                bar0.commit_copy_async();
            }
        }
        if kt > 0 {
            if buf == 0 {
                bar0.arrive_and_wait();
            } else {
                bar1.arrive_and_wait();
            }
        }
        let kbuf = buf * comptime![bk * stride];

        // S = Q Kᵀ (16 rows x bk keys per plane).
        #[unroll]
        for j in 0..comptime![nk * 2] {
            s_acc[j] = Vector::new(0f32);
        }
        #[unroll]
        for c in 0..dk {
            let mut a = Array::<Vector<F, NA>>::new(4usize);
            #[unroll]
            for r in 0..4usize {
                a[r] = q_frag[c * 4 + r];
            }
            #[unroll]
            for jj in 0..comptime![nk / 2] {
                let start = kbuf + (jj * 16 + k_lrow) * stride + c * 16 + k_lcol;
                let regs = def.load_matrix::<F, NB>(
                    &k_sh[start..start + 8],
                    MatrixIdent::B,
                    4usize,
                    false,
                );
                #[unroll]
                for half in 0..2usize {
                    let mut bb = Array::<Vector<F, NB>>::new(2usize);
                    bb[0] = regs[half * 2];
                    bb[1] = regs[half * 2 + 1];
                    let j = jj * 2 + half;
                    let mut cc = Array::<Vector<f32, NC>>::new(2usize);
                    cc[0] = s_acc[j * 2];
                    cc[1] = s_acc[j * 2 + 1];
                    def.execute_inplace(&a, &bb, &mut cc);
                    s_acc[j * 2] = cc[0];
                    s_acc[j * 2 + 1] = cc[1];
                }
            }
        }

        // Scale, mask, online softmax. Lane holds rows g (vector 0) and g + 8 (vector 1) of the
        // plane's 16, columns 8j + 2t + {0, 1}; the 4 lanes of a quad share a row.
        let masked = (kt + 1) * bk as u32 > k_unmasked;
        let mut mx0 = empty;
        let mut mx1 = empty;
        #[unroll]
        for j in 0..nk {
            let mut v0 = s_acc[j * 2];
            let mut v1 = s_acc[j * 2 + 1];
            if masked {
                let key = kt * bk as u32 + (j * 8) as u32 + 2 * t;
                v0.insert(0usize, select(key < lim0, v0.extract(0usize), empty));
                v0.insert(1usize, select(key + 1 < lim0, v0.extract(1usize), empty));
                v1.insert(0usize, select(key < lim1, v1.extract(0usize), empty));
                v1.insert(1usize, select(key + 1 < lim1, v1.extract(1usize), empty));
                s_acc[j * 2] = v0;
                s_acc[j * 2 + 1] = v1;
            }
            mx0 = max(mx0, max(v0.extract(0usize), v0.extract(1usize)));
            mx1 = max(mx1, max(v1.extract(0usize), v1.extract(1usize)));
        }
        mx0 = max(mx0, plane_shuffle_xor(mx0, 1u32));
        mx0 = max(mx0, plane_shuffle_xor(mx0, 2u32));
        mx1 = max(mx1, plane_shuffle_xor(mx1, 1u32));
        mx1 = max(mx1, plane_shuffle_xor(mx1, 2u32));
        // Maxima stay in raw score units (the scale is positive); the scale and log2(e) fold
        // into one FFMA per score in front of `ex2`. A row that has seen nothing yet uses 0, so
        // its masked scores (EMPTY_MAX * c) still give 2^(-huge) = 0.
        let mn0 = max(m0, mx0);
        let mn1 = max(m1, mx1);
        let mc0 = select(mn0 == empty, 0f32, mn0 * c);
        let mc1 = select(mn1 == empty, 0f32, mn1 * c);
        let alpha0 = exp2_approx(m0 * c - mc0);
        let alpha1 = exp2_approx(m1 * c - mc1);
        m0 = mn0;
        m1 = mn1;
        l0 *= alpha0;
        l1 *= alpha1;
        #[unroll]
        for n in 0..dn {
            o_acc[n * 2] *= Vector::new(alpha0);
            o_acc[n * 2 + 1] *= Vector::new(alpha1);
        }
        #[unroll]
        for j in 0..nk {
            let v0 = s_acc[j * 2];
            let v1 = s_acc[j * 2 + 1];
            let mut p0 = Vector::<f32, NC>::empty();
            let mut p1 = Vector::<f32, NC>::empty();
            #[unroll]
            for e in 0..2usize {
                let e0 = exp2_approx(fma(v0.extract(e), c, -mc0));
                let e1 = exp2_approx(fma(v1.extract(e), c, -mc1));
                l0 += e0;
                l1 += e1;
                p0.insert(e, e0);
                p1.insert(e, e1);
            }
            s_acc[j * 2] = p0;
            s_acc[j * 2 + 1] = p1;
        }

        // O += P V: the accumulator layout of two n8 chunks of P is the A layout of one k16
        // chunk, so P goes from registers to the next mma without shared memory.
        #[unroll]
        for kk in 0..kk_n {
            let mut a = Array::<Vector<F, NA>>::new(4usize);
            a[0] = Vector::<F, NA>::cast_from(s_acc[kk * 4]);
            a[1] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 1]);
            a[2] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 2]);
            a[3] = Vector::<F, NA>::cast_from(s_acc[kk * 4 + 3]);
            #[unroll]
            for np in 0..comptime![dn / 2] {
                let start = kbuf + (kk * 16 + v_lrow) * stride + np * 16 + v_lcol;
                let regs =
                    def.load_matrix::<F, NB>(&v_sh[start..start + 8], MatrixIdent::B, 4usize, true);
                #[unroll]
                for half in 0..2usize {
                    let n = np * 2 + half;
                    let mut bb = Array::<Vector<F, NB>>::new(2usize);
                    bb[0] = regs[half * 2];
                    bb[1] = regs[half * 2 + 1];
                    let mut cc = Array::<Vector<f32, NC>>::new(2usize);
                    cc[0] = o_acc[n * 2];
                    cc[1] = o_acc[n * 2 + 1];
                    def.execute_inplace(&a, &bb, &mut cc);
                    o_acc[n * 2] = cc[0];
                    o_acc[n * 2 + 1] = cc[1];
                }
            }
        }
        sync_cube();
    }

    // The row sums were kept per lane; the quad holds the whole row.
    l0 += plane_shuffle_xor(l0, 1u32);
    l0 += plane_shuffle_xor(l0, 2u32);
    l1 += plane_shuffle_xor(l1, 1u32);
    l1 += plane_shuffle_xor(l1, 2u32);
    let inv0 = select(l0 > 0f32, 1f32 / l0, 0f32);
    let inv1 = select(l1 > 0f32, 1f32 / l1, 0f32);
    let col = (2 * t) as usize;
    if i0 < geo.lq {
        let base = q_base + i0 as usize * q_stride + col;
        #[unroll]
        for n in 0..dn {
            let o = o_acc[n * 2] * Vector::new(inv0);
            out[base + n * 8] = F::cast_from(o.extract(0usize));
            out[base + n * 8 + 1] = F::cast_from(o.extract(1usize));
        }
    }
    if i0 + 8 < geo.lq {
        let base = q_base + (i0 + 8) as usize * q_stride + col;
        #[unroll]
        for n in 0..dn {
            let o = o_acc[n * 2 + 1] * Vector::new(inv1);
            out[base + n * 8] = F::cast_from(o.extract(0usize));
            out[base + n * 8 + 1] = F::cast_from(o.extract(1usize));
        }
    }
}

/// Launches [`mma_kernel`]: one cube per (block of `16 * warps` queries, query head, sequence).
pub(crate) fn launch_mma<R: Runtime>(
    client: &ComputeClient<R>,
    p: &super::Problem<'_, R>,
    len_t: &crate::DeviceTensor<R>,
    cfg: MmaConfigAttn,
) {
    let blocks = p.lq.div_ceil(cfg.bq());
    unsafe {
        mma_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(blocks as u32, p.hq as u32, p.batch as u32),
            CubeDim::new_1d((32 * cfg.warps) as u32),
            p.q.as_buffer_arg(),
            p.k.as_buffer_arg(),
            p.v.as_buffer_arg(),
            len_t.as_buffer_arg(),
            p.out.as_buffer_arg(),
            p.len_host(),
            p.lq as u32,
            p.hq as u32,
            p.hkv as u32,
            (p.hq / p.hkv) as u32,
            p.kv_rows as u32,
            blocks as u32,
            p.scale * std::f32::consts::LOG2_E,
            cfg,
            p.q.dtype().elem_type(),
        );
    }
}
