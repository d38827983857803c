//! FlashAttention-2 on tensor cores for many queries (CUDA only): CubeCL's manual `mma`
//! (m16n8k16, f16/bf16 in, f32 accumulate). Each plane owns 16 query rows of a `16 * warps`-row
//! block and runs the shared step of `flash_step.rs` over `bk`-key K/V tiles double-buffered with
//! `cp.async`; S = Q·Kᵀ and O += P·V stay in registers.

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::barrier::Barrier;
use cubecl::prelude::*;

use super::flash_step::{
    copy_rows_async, first_kv_tile, flash_step, lane_addresses, lane_rows, load_q_fragments,
    next_kv_tile, quad_sum, zeroed_output, StepShape,
};
use super::geometry::{kv_first_row, kv_len, visible_keys, Geometry};
use super::plan::Problem;
use super::FlashTiling;
use crate::DeviceTensor;

/// The comptime shape of [`flash_kernel`]: `16 * warps` query rows and `bk` keys per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FlashBlueprint {
    pub d: usize,
    /// Planes per cube; each owns 16 query rows.
    pub warps: usize,
    /// Keys per K/V tile.
    pub bk: usize,
    pub causal: bool,
    pub device_len: bool,
}

impl FlashBlueprint {
    pub fn new(d: usize, tiling: FlashTiling, causal: bool, device_len: bool) -> Self {
        Self {
            d,
            warps: tiling.warps,
            bk: tiling.bk,
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

    /// The step of one plane: the whole `bk`-key tile.
    pub fn step(&self) -> StepShape {
        StepShape {
            d: self.d,
            keys: self.bk,
            stride: self.stride(),
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_kernel<F: Float>(
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
    #[comptime] blueprint: FlashBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let geo = Geometry {
        len_host,
        lq,
        hq,
        hkv,
        group,
        kv_rows,
        chunk: 0u32,
        splits: 1u32,
        row_blocks,
        scale,
        ragged: 0u32,
        slots: 1u32,
    };
    let d = comptime![blueprint.d];
    let bk = comptime![blueprint.bk];
    let bq = comptime![blueprint.bq()];
    let stride = comptime![blueprint.stride()];
    let shape = comptime![blueprint.step()];
    let dn = comptime![blueprint.d / 8];

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
    let len = kv_len(len_buf, &geo, b, blueprint.device_len);

    let row0 = qb * bq as u32;
    let last_row = min(row0 + bq as u32, geo.lq) - 1;
    // Keys the last row of the block sees (tiles past them are never loaded) and the first row
    // sees (tiles below it need no mask).
    let k_end = visible_keys(last_row, len, geo.lq, blueprint.causal);
    let k_unmasked = visible_keys(row0, len, geo.lq, blueprint.causal);
    let n_tiles = k_end.div_ceil(bk as u32);

    let mut q_sh = Shared::<[F]>::new_aligned_slice(comptime![bq * stride], 16usize);
    let mut k_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let mut v_sh = Shared::<[F]>::new_aligned_slice(comptime![2 * bk * stride], 16usize);
    let bar0 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);
    let bar1 = Barrier::shared(CUBE_DIM, UNIT_POS == 0);

    let q_stride = (geo.hq as usize) * d;
    let q_base = (b * geo.lq) as usize * q_stride + h as usize * d;
    let kv_stride = (geo.hkv as usize) * d;
    let kv_base = kv_first_row(len_buf, &geo, b) as usize * kv_stride + hk as usize * d;
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
    first_kv_tile::<F>(
        k, v, &mut k_sh, &mut v_sh, &bar0, n_tiles, 0usize, kv_base, kv_stride, last_key, bk, d,
        stride,
    );

    let lanes = lane_addresses(lane);
    let q_frag = load_q_fragments::<F, NA>(
        &def,
        &q_sh,
        (warp as usize * 16 + lanes.q_row) * stride,
        &lanes,
        shape,
    );

    let mut o_acc = zeroed_output::<NC>(shape);
    let mut s_acc = Array::<Vector<f32, NC>>::new(comptime![shape.nk() * 2]);
    let i0 = row0 + warp * 16 + g;
    let lim0 = visible_keys(i0, len, geo.lq, blueprint.causal);
    let lim1 = visible_keys(i0 + 8, len, geo.lq, blueprint.causal);
    let mut rows = lane_rows(t, lim0, lim1);
    // `scale * log2(e)` (the host passes it in place of the scale).
    let c = geo.scale;

    for kt in 0..n_tiles {
        let buf = next_kv_tile::<F>(
            k, v, &mut k_sh, &mut v_sh, &bar0, &bar1, kt, n_tiles, 0usize, kv_base, kv_stride,
            last_key, bk, d, stride,
        );
        let kbuf = buf * comptime![bk * stride];
        let masked = (kt + 1) * bk as u32 > k_unmasked;
        flash_step::<F, NA, NB, NC>(
            &def,
            &q_frag,
            &k_sh,
            &v_sh,
            kbuf,
            &lanes,
            &mut s_acc,
            &mut o_acc,
            &mut rows,
            masked,
            kt * bk as u32,
            c,
            shape,
        );
        sync_cube();
    }

    // The row sums were kept per lane; the quad holds the whole row.
    let l0 = quad_sum(rows.l0);
    let l1 = quad_sum(rows.l1);
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

/// Launches [`flash_kernel`]: one cube per (block of `16 * warps` queries, query head, sequence).
pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    len_t: &DeviceTensor<R>,
    blueprint: FlashBlueprint,
) {
    let blocks = p.lq.div_ceil(blueprint.bq());
    unsafe {
        flash_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(blocks as u32, p.hq as u32, p.batch as u32),
            CubeDim::new_1d((32 * blueprint.warps) as u32),
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
            blueprint,
            p.q.dtype().elem_type(),
        );
    }
}
