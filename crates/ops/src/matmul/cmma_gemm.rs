//! Tensor-core GEMM for f16/bf16 through CubeCL's `cmma` (warp-level 16x16x16 fragments with
//! f32 accumulators; `mma.sync` on NVIDIA).
//!
//! Each cube (8 planes) owns a `BM x BN` tile of y, stages `BM x BK` of x and `BN x BK` of w in
//! shared memory (rows padded by 8 elements against bank conflicts; w stays `[n][k]`, which is
//! exactly the column-major B operand), and each plane accumulates a `(BM / WARPS_M) x
//! (BN / WARPS_N)` sub-tile as a grid of fragments. The epilogue goes through a per-plane
//! 16x16 f32 scratch so that bias, residual, the gated activation and bounds are applied per
//! element. Tiles are visited in grouped order for L2 reuse of w.

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

use super::gemv::activation;
use super::tiled::grouped_tile;
use super::{Activation, Problem};
use crate::{caps, DType, DeviceTensor};

/// Comptime configuration (the kernel's compile key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmmaPlan {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub warps_m: u32,
    pub warps_n: u32,
    pub group_m: u32,
    pub has_bias: bool,
    pub has_residual: bool,
    pub gated: bool,
    pub gelu: bool,
}

const PAD: u32 = 8;
const FRAG: u32 = 16;

impl CmmaPlan {
    fn frags_m(&self) -> u32 {
        self.bm / self.warps_m / FRAG
    }
    fn frags_n(&self) -> u32 {
        self.bn / self.warps_n / FRAG
    }
    fn stride(&self) -> u32 {
        self.bk + PAD
    }
    fn units(&self) -> u32 {
        self.warps_m * self.warps_n * 32
    }
}

/// Whether the runtime has 16x16x16 fragments of `dtype` with f32 accumulation.
pub(crate) fn supported<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    let kind = match dtype {
        DType::F16 => FloatKind::F16,
        DType::BF16 => FloatKind::BF16,
        _ => return false,
    };
    if caps::plane_size_min(client) != 32 || client.properties().hardware.plane_size_max != 32 {
        return false;
    }
    let want = ElemType::Float(kind);
    let acc = ElemType::Float(FloatKind::F32);
    client.features().matmul.cmma.iter().any(|c: &MmaConfig| {
        c.a_type == want
            && c.b_type == want
            && c.cd_type == acc
            && c.m == 16
            && c.n == 16
            && c.k == 16
    })
}

/// Copies a `rows x bk` tile of a row-major `[rows_total, k]` matrix (vectors of `N`) into
/// shared memory rows of `stride` elements, zero-filling outside the matrix.
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_tile<F: Float, N: Size>(
    src: &[Vector<F, N>],
    dst: &mut [F],
    row0: usize,
    k0: usize,
    rows_total: usize,
    k_vectors: usize,
    #[comptime] rows: u32,
    #[comptime] bk: u32,
    #[comptime] stride: u32,
    #[comptime] units: u32,
) {
    let vec = src[0].vector_size();
    let per_row = comptime![bk as usize] / vec;
    let total = comptime![rows as usize] * per_row;
    let k0v = k0 / vec;
    for idx in range_stepped(UNIT_POS as usize, total, units as usize) {
        let r = idx / per_row;
        let cv = idx % per_row;
        let gr = row0 + r;
        let gk = k0v + cv;
        let mut v = Vector::<F, N>::new(F::new(0.0));
        if gr < rows_total && gk < k_vectors {
            v = src[gr * k_vectors + gk];
        }
        let base = r * stride as usize + cv * vec;
        #[unroll]
        for l in 0..vec {
            dst[base + l] = v.extract(l);
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cmma_gemm_kernel<F: Float, N: Size>(
    x: &[Vector<F, N>],
    w: &[Vector<F, N>],
    w_up: &[Vector<F, N>],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n_total: usize,
    k: usize,
    up_row_offset: usize,
    #[comptime] plan: CmmaPlan,
    #[define(F)] _dtype: ElemType,
) {
    let tiles_m = m.div_ceil(plan.bm as usize);
    let tiles_n = n_total.div_ceil(plan.bn as usize);
    if CUBE_POS >= tiles_m * tiles_n {
        terminate!();
    }
    let (tile_m, tile_n) = grouped_tile(CUBE_POS, tiles_m, tiles_n, plan.group_m);
    let m0 = tile_m * plan.bm as usize;
    let n0 = tile_n * plan.bn as usize;
    let warp = (UNIT_POS / 32) as usize;
    let lane = (UNIT_POS % 32) as usize;
    let wm = warp / plan.warps_n as usize;
    let wn = warp % plan.warps_n as usize;
    let fm = comptime![plan.frags_m() as usize];
    let fnn = comptime![plan.frags_n() as usize];
    let stride = comptime![plan.stride()];
    let k_vectors = k / x[0].vector_size();

    let mut xs = Shared::<[F]>::new_slice(comptime![(plan.bm * plan.stride()) as usize]);
    let mut ws = Shared::<[F]>::new_slice(comptime![(plan.bn * plan.stride()) as usize]);
    let mut us = Shared::<[F]>::new_slice(comptime![(plan.bn * plan.stride()) as usize]);
    let mut scratch = Shared::<[f32]>::new_slice(comptime![
        (plan.warps_m * plan.warps_n * FRAG * FRAG) as usize
    ]);

    let mut accs = Sequence::<cmma::Matrix<f32>>::new();
    let mut accs_up = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _ in 0..fm * fnn {
        accs.push(cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            cmma::MatrixLayout::Undefined,
            0f32,
        ));
        if comptime![plan.gated] {
            accs_up.push(cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                16usize,
                16usize,
                16usize,
                cmma::MatrixLayout::Undefined,
                0f32,
            ));
        }
    }

    let row_a = wm * fm * FRAG as usize;
    let col_b = wn * fnn * FRAG as usize;
    for k0 in range_stepped(0, k, plan.bk as usize) {
        stage_tile::<F, N>(
            x,
            &mut xs,
            m0,
            k0,
            m,
            k_vectors,
            plan.bm,
            plan.bk,
            stride,
            plan.units(),
        );
        stage_tile::<F, N>(
            w,
            &mut ws,
            n0,
            k0,
            n_total,
            k_vectors,
            plan.bn,
            plan.bk,
            stride,
            plan.units(),
        );
        if comptime![plan.gated] {
            stage_tile::<F, N>(
                w_up,
                &mut us,
                up_row_offset + n0,
                k0,
                up_row_offset + n_total,
                k_vectors,
                plan.bn,
                plan.bk,
                stride,
                plan.units(),
            );
        }
        sync_cube();
        #[unroll]
        for kk in 0..plan.bk / FRAG {
            let koff = (kk * FRAG) as usize;
            let mut a_frags = Sequence::<cmma::Matrix<F>>::new();
            #[unroll]
            for i in 0..fm {
                let start = (row_a + i * FRAG as usize) * stride as usize + koff;
                a_frags.push(cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::A,
                    16usize,
                    16usize,
                    16usize,
                    cmma::MatrixLayout::RowMajor,
                    &xs[start..start + (FRAG * stride) as usize],
                    stride,
                ));
            }
            #[unroll]
            for j in 0..fnn {
                let start = (col_b + j * FRAG as usize) * stride as usize + koff;
                let b = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::B,
                    16usize,
                    16usize,
                    16usize,
                    cmma::MatrixLayout::ColMajor,
                    &ws[start..start + (FRAG * stride) as usize],
                    stride,
                );
                #[unroll]
                for i in 0..fm {
                    let acc = accs.index(i * fnn + j);
                    cmma::execute(a_frags.index(i), &b, acc, acc);
                }
                if comptime![plan.gated] {
                    let bu = cmma::Matrix::<F>::from_slice(
                        cmma::MatrixIdent::B,
                        16usize,
                        16usize,
                        16usize,
                        cmma::MatrixLayout::ColMajor,
                        &us[start..start + (FRAG * stride) as usize],
                        stride,
                    );
                    #[unroll]
                    for i in 0..fm {
                        let acc = accs_up.index(i * fnn + j);
                        cmma::execute(a_frags.index(i), &bu, acc, acc);
                    }
                }
            }
        }
        sync_cube();
    }

    // Epilogue: fragment -> per-plane scratch -> global, element by element.
    let sbase = warp * (FRAG * FRAG) as usize;
    #[unroll]
    for i in 0..fm {
        #[unroll]
        for j in 0..fnn {
            cmma::store(
                &mut scratch[sbase..sbase + (FRAG * FRAG) as usize],
                accs.index(i * fnn + j),
                16,
                cmma::MatrixLayout::RowMajor,
            );
            sync_plane();
            let mut gate = Array::<f32>::new(8usize);
            #[unroll]
            for e in 0..8u32 {
                gate[e as usize] = scratch[sbase + lane * 8 + e as usize];
            }
            if comptime![plan.gated] {
                sync_plane();
                cmma::store(
                    &mut scratch[sbase..sbase + (FRAG * FRAG) as usize],
                    accs_up.index(i * fnn + j),
                    16,
                    cmma::MatrixLayout::RowMajor,
                );
                sync_plane();
            }
            #[unroll]
            for e in 0..8u32 {
                let idx = lane * 8 + e as usize;
                let gm = m0 + row_a + i * FRAG as usize + idx / 16;
                let gn = n0 + col_b + j * FRAG as usize + idx % 16;
                if gm < m && gn < n_total {
                    let mut y = gate[e as usize];
                    if comptime![plan.gated] {
                        let g = f32::cast_from(F::cast_from(y));
                        let u = f32::cast_from(F::cast_from(scratch[sbase + idx]));
                        y = activation(g, plan.gelu) * u;
                    }
                    if comptime![plan.has_bias] {
                        y += f32::cast_from(bias[gn]);
                    }
                    if comptime![plan.has_residual] {
                        y += f32::cast_from(residual[gm * n_total + gn]);
                    }
                    out[gm * n_total + gn] = F::cast_from(y);
                }
            }
            sync_plane();
        }
    }
}

pub(crate) fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    p: &Problem<'_, R>,
    bias: &DeviceTensor<R>,
    residual: &DeviceTensor<R>,
) {
    let gated = p.gated.is_some();
    // The gated kernel keeps two accumulator sets: a narrower tile keeps it in registers.
    let (bn, warps_n) = if gated { (64, 4) } else { (128, 4) };
    let plan = CmmaPlan {
        bm: 128,
        bn,
        bk: 32,
        warps_m: 2,
        warps_n,
        group_m: 8,
        has_bias: p.bias.is_some(),
        has_residual: p.residual.is_some(),
        gated,
        gelu: p.gated == Some(Activation::Gelu),
    };
    let vector = caps::vector_size_for(client, p.x.dtype(), p.k).min(plan.bk as usize);
    let tiles = p.m.div_ceil(plan.bm as usize) * p.n.div_ceil(plan.bn as usize);
    unsafe {
        cmma_gemm_kernel::launch_unchecked::<R>(
            client,
            crate::launch::cube_count_1d(client, tiles as u32),
            CubeDim::new_1d(plan.units()),
            vector,
            p.x.as_buffer_arg(),
            p.w.as_buffer_arg(),
            p.w_up.as_buffer_arg(),
            bias.as_buffer_arg(),
            residual.as_buffer_arg(),
            p.out.as_buffer_arg(),
            p.m,
            p.n,
            p.k,
            p.up_row_offset,
            plan,
            p.x.dtype().elem_type(),
        );
    }
}
