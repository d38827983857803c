//! The decode kernel's RoPE launch ([`super::SplitKvMmaBlueprint::rope`]): the query rows and
//! the newest key rotated in the kernel, the newest key and value appended to the cache by the
//! cube whose split holds them.

use cubecl::prelude::barrier::copy_async;
use cubecl::prelude::*;

use crate::attention::geometry::{Geometry, SplitBuffers};
use crate::DeviceTensor;

/// The operands a [`super::SplitKvMmaBlueprint::rope`] launch reads beside the problem's: the
/// QKV row (`[1, (Hq + 2 Hkv) · D]`) and the f32 cos / sin tables (`[rows, D / 2]`), all
/// validated.
pub(crate) struct RopeLaunch<'a, R: Runtime> {
    pub qkv: &'a DeviceTensor<R>,
    pub cos: &'a DeviceTensor<R>,
    pub sin: &'a DeviceTensor<R>,
}

/// The RoPE tables of a [`super::SplitKvMmaBlueprint::rope`] launch (placeholders otherwise): f32
/// `[rows, D / 2]`, entry `[p, i] = cos(p · inv_freq[i])` and its sine.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct RopeTables {
    pub cos: Box<[f32]>,
    pub sin: Box<[f32]>,
    pub rows: u32,
}

/// `(a, b)` rotated by RoPE with factors `(cos, sin)`, rounded to the dtype: the arithmetic of
/// the separate kernel (`crate::qkv`), so that both paths give the same bits.
#[cube]
fn rotate<F: Float>(a: F, b: F, cos: f32, sin: f32) -> (F, F) {
    let a = f32::cast_from(a);
    let b = f32::cast_from(b);
    (
        F::cast_from(a * cos - b * sin),
        F::cast_from(b * cos + a * sin),
    )
}

/// A RoPE launch's work after the wait: the query rows of the block gathered from their heads
/// and rotated at position `pos` into `q_sh` (rows past the last repeat it), and in the `owner`
/// cube KV head `CUBE_POS_Y`'s newest key (rotated) and value written to cache row `dst` (the
/// element offset of that row's head) and, with `direct`, to element `row` of the first tile's
/// shared-memory buffers. Every load is issued before the first result is used, so the cube
/// waits for one memory latency, not one per row pass.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn rotate_into_tiles<F: Float>(
    io: &mut SplitBuffers<F, f32>,
    q_sh: &mut [F],
    k_sh: &mut [F],
    v_sh: &mut [F],
    rope: &RopeTables,
    geo: &Geometry,
    pos: u32,
    owner: bool,
    direct: bool,
    dst: usize,
    row: usize,
    first_rho: u32,
    rows_total: u32,
    #[comptime] d: usize,
    #[comptime] stride: usize,
    #[comptime] units: usize,
) {
    let half = comptime![d / 2];
    let pairs = comptime![16 * d / 2];
    let iters = comptime![pairs.div_ceil(units)];
    let kv_iters = comptime![half.div_ceil(units)];
    let p = min(pos, rope.rows - 1) as usize * half;
    let hk = CUBE_POS_Y;
    let k_src = (geo.hq + hk) as usize * d;
    let v_src = (geo.hq + geo.hkv + hk) as usize * d;

    let mut kv = Array::<F>::new(comptime![4 * kv_iters]);
    let mut kv_f = Array::<f32>::new(comptime![2 * kv_iters]);
    if owner {
        #[unroll]
        for j in 0..kv_iters {
            let i = min(UNIT_POS as usize + j * units, half - 1);
            kv[4 * j] = io.q[k_src + i];
            kv[4 * j + 1] = io.q[k_src + i + half];
            kv[4 * j + 2] = io.q[v_src + i];
            kv[4 * j + 3] = io.q[v_src + i + half];
            kv_f[2 * j] = rope.cos[p + i];
            kv_f[2 * j + 1] = rope.sin[p + i];
        }
    }
    let mut qv = Array::<F>::new(comptime![2 * iters]);
    let mut qf = Array::<f32>::new(comptime![2 * iters]);
    #[unroll]
    for k in 0..iters {
        let e = min(UNIT_POS as usize + k * units, pairs - 1);
        let i = e % half;
        let rho = min(first_rho + (e / half) as u32, rows_total - 1);
        let src = (hk * geo.group + rho % geo.group) as usize * d + i;
        qv[2 * k] = io.q[src];
        qv[2 * k + 1] = io.q[src + half];
        qf[2 * k] = rope.cos[p + i];
        qf[2 * k + 1] = rope.sin[p + i];
    }

    if owner {
        #[unroll]
        for j in 0..kv_iters {
            let i = UNIT_POS as usize + j * units;
            if i < half {
                let (ka, kb) = rotate::<F>(kv[4 * j], kv[4 * j + 1], kv_f[2 * j], kv_f[2 * j + 1]);
                let va = kv[4 * j + 2];
                let vb = kv[4 * j + 3];
                io.k[dst + i] = ka;
                io.k[dst + i + half] = kb;
                io.v[dst + i] = va;
                io.v[dst + i + half] = vb;
                if direct {
                    k_sh[row + i] = ka;
                    k_sh[row + i + half] = kb;
                    v_sh[row + i] = va;
                    v_sh[row + i + half] = vb;
                }
            }
        }
    }
    #[unroll]
    for k in 0..iters {
        let e = UNIT_POS as usize + k * units;
        if e < pairs {
            let r = e / half;
            let i = e % half;
            let (a, b) = rotate::<F>(qv[2 * k], qv[2 * k + 1], qf[2 * k], qf[2 * k + 1]);
            q_sh[r * stride + i] = a;
            q_sh[r * stride + i + half] = b;
        }
    }
}

/// Queues the copies of the first tile (keys from `tile0`) into buffer 0, all but row `newest`,
/// the rows past it repeating key `tile0 + newest - 1`: only older keys are read, so the copies
/// may go out before `griddepcontrol.wait`. The caller guarantees `tile0 + newest >= 1`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn queue_tile_but_newest<F: Float>(
    k: &[F],
    v: &[F],
    k_sh: &mut [F],
    v_sh: &mut [F],
    tile0: usize,
    kv_base: usize,
    kv_stride: usize,
    newest: usize,
    #[comptime] bk: usize,
    #[comptime] d: usize,
    #[comptime] stride: usize,
) {
    let per_row = comptime![d / 8];
    let padding = tile0 + newest - 1;
    for e in range_stepped(UNIT_POS as usize, comptime![bk * d / 8], CUBE_DIM as usize) {
        let r = e / per_row;
        let c = (e % per_row) * 8;
        if r != newest {
            let sr = select(r < newest, tile0 + r, padding);
            let s = kv_base + sr * kv_stride + c;
            let t = r * stride + c;
            copy_async(&k[s..s + 8], &mut k_sh[t..t + 8], 8u32);
            copy_async(&v[s..s + 8], &mut v_sh[t..t + 8], 8u32);
        }
    }
}
