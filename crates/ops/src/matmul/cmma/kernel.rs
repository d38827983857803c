//! The tensor-core GEMM kernel: its operand stages (what [`run_async_pipeline()`] and
//! [`run_register_double_buffer()`] drive) and the tensor-core work of one K step.

use cubecl::cmma;
use cubecl::prelude::*;

use super::blueprint::{CmmaBlueprint, PLANE};
use crate::gemm::{
    grouped_tile, issue_tile_async, load_tile_regs, run_async_pipeline, run_register_double_buffer,
    store_tile_regs, write_fragments, AsyncStages, RegisterStages, FRAG,
};

/// One K step of tensor-core work on buffer `buf`: every plane multiplies its fragments.
#[cube]
#[allow(clippy::too_many_arguments)]
fn compute_step<F: Float, N: Size>(
    a_s: &[Vector<F, N>],
    b_s: &[Vector<F, N>],
    accs: &mut Sequence<cmma::Matrix<f32>>,
    a_frags: &mut Sequence<cmma::Matrix<F>>,
    b_frag: &mut cmma::Matrix<F>,
    buf: usize,
    wm: usize,
    wn: usize,
    #[comptime] bp: CmmaBlueprint,
) {
    let vector = comptime![bp.vector as usize];
    let ldk = comptime![bp.ldk()];
    let fm = comptime![bp.frags_m()];
    let fnn = comptime![bp.frags_n()];
    let frag_len = comptime![bp.frag_len()];
    let a_base =
        buf * comptime![bp.a_tile().stage_len()] + wm * comptime![bp.plane_rows() * bp.pitch()];
    let b_base =
        buf * comptime![bp.b_tile().stage_len()] + wn * comptime![bp.b_plane_step() * bp.pitch()];
    #[unroll]
    for kk in 0..comptime![bp.bk as usize / FRAG] {
        #[unroll]
        for i in 0..fm {
            let start = a_base + comptime![(i * FRAG * ldk + kk * FRAG) / vector];
            cmma::load(
                a_frags.index_mut(i),
                &a_s[start..start + frag_len],
                ldk as u32,
            );
        }
        #[unroll]
        for j in 0..fnn {
            let start = b_base + comptime![(bp.frag_b_row(j) * ldk + kk * FRAG) / vector];
            cmma::load(b_frag, &b_s[start..start + frag_len], ldk as u32);
            #[unroll]
            for i in 0..fm {
                let acc = accs.index(i * fnn + j);
                cmma::execute(a_frags.index(i), &*b_frag, acc, acc);
            }
        }
    }
}

/// A cube's operands, shared buffers and fragments: the state the stage drivers run on.
#[derive(CubeType)]
struct CmmaStages<'a, F: Float, N: Size> {
    x: &'a [Vector<F, N>],
    w: &'a [Vector<F, N>],
    w_up: &'a [Vector<F, N>],
    /// `buffers` stages of `[bm][pitch]` x vectors.
    a_s: Shared<[Vector<F, N>]>,
    /// `buffers` stages of `[bn][pitch]` weight vectors.
    b_s: Shared<[Vector<F, N>]>,
    /// The plane's `frags_m x frags_n` f32 accumulators.
    accs: Sequence<cmma::Matrix<f32>>,
    a_frags: Sequence<cmma::Matrix<F>>,
    b_frag: cmma::Matrix<F>,
    // Sizes by reference: a struct field of a value type would be a mutable copy.
    m0: &'a usize,
    n0: &'a usize,
    m: &'a usize,
    n: &'a usize,
    k_vecs: &'a usize,
    up_offset: &'a usize,
    wm: &'a usize,
    wn: &'a usize,
    #[cube(comptime)]
    bp: CmmaBlueprint,
}

#[cube]
impl<'a, F: Float, N: Size> CmmaStages<'a, F, N> {
    /// Declares the cube's shared buffers and the plane's fragments (accumulators at zero).
    #[allow(clippy::too_many_arguments)]
    fn new(
        x: &'a [Vector<F, N>],
        w: &'a [Vector<F, N>],
        w_up: &'a [Vector<F, N>],
        m0: &'a usize,
        n0: &'a usize,
        m: &'a usize,
        n: &'a usize,
        k_vecs: &'a usize,
        up_offset: &'a usize,
        wm: &'a usize,
        wn: &'a usize,
        #[comptime] bp: CmmaBlueprint,
    ) -> CmmaStages<'a, F, N> {
        let nbuf = comptime![bp.buffers()];
        let a_s = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime![nbuf * bp.a_tile().stage_len()],
            128usize,
        );
        let b_s = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime![nbuf * bp.b_tile().stage_len()],
            128usize,
        );

        let mut accs = Sequence::<cmma::Matrix<f32>>::new();
        #[unroll]
        for _ in 0..comptime![bp.frags_m() * bp.frags_n()] {
            accs.push(cmma::Matrix::<f32>::from_value(
                cmma::MatrixIdent::Accumulator,
                FRAG,
                FRAG,
                FRAG,
                cmma::MatrixLayout::Undefined,
                0f32,
            ));
        }
        let mut a_frags = Sequence::<cmma::Matrix<F>>::new();
        #[unroll]
        for _ in 0..comptime![bp.frags_m()] {
            a_frags.push(unsafe {
                cmma::Matrix::<F>::uninitialized(
                    cmma::MatrixIdent::A,
                    FRAG,
                    FRAG,
                    FRAG,
                    cmma::MatrixLayout::RowMajor,
                )
            });
        }
        let b_frag = unsafe {
            cmma::Matrix::<F>::uninitialized(
                cmma::MatrixIdent::B,
                FRAG,
                FRAG,
                FRAG,
                cmma::MatrixLayout::ColMajor,
            )
        };
        CmmaStages::<'a, F, N> {
            x,
            w,
            w_up,
            a_s,
            b_s,
            accs,
            a_frags,
            b_frag,
            m0,
            n0,
            m,
            n,
            k_vecs,
            up_offset,
            wm,
            wn,
            bp,
        }
    }
}

#[cube]
impl<'a, F: Float, N: Size> AsyncStages for CmmaStages<'a, F, N> {
    fn issue(this: &mut Self, stage: usize, step: usize) {
        let bp = comptime![this.bp];
        let k0v = step * comptime![bp.row_vectors()];
        issue_tile_async(
            this.x,
            this.x,
            &mut this.a_s,
            stage * comptime![bp.a_tile().stage_len()],
            *this.m0,
            *this.m,
            0usize,
            k0v,
            *this.k_vecs,
            comptime![bp.a_tile()],
            bp.vector,
        );
        issue_tile_async(
            this.w,
            this.w_up,
            &mut this.b_s,
            stage * comptime![bp.b_tile().stage_len()],
            *this.n0,
            *this.n,
            *this.up_offset,
            k0v,
            *this.k_vecs,
            comptime![bp.b_tile()],
            bp.vector,
        );
    }

    fn compute(this: &mut Self, stage: usize, _step: usize) {
        compute_step(
            &this.a_s,
            &this.b_s,
            &mut this.accs,
            &mut this.a_frags,
            &mut this.b_frag,
            stage,
            *this.wm,
            *this.wn,
            this.bp,
        );
    }
}

#[cube]
impl<'a, F: Float, N: Size> RegisterStages<Vector<F, N>> for CmmaStages<'a, F, N> {
    fn load(this: &mut Self, regs: &mut Array<Vector<F, N>>, step: usize) {
        let bp = comptime![this.bp];
        let k0v = step * comptime![bp.row_vectors()];
        load_tile_regs(
            this.x,
            this.x,
            regs,
            *this.m0,
            *this.m,
            0usize,
            k0v,
            *this.k_vecs,
            0usize,
            comptime![bp.a_tile()],
        );
        load_tile_regs(
            this.w,
            this.w_up,
            regs,
            *this.n0,
            *this.n,
            *this.up_offset,
            k0v,
            *this.k_vecs,
            comptime![bp.a_tile().per_unit()],
            comptime![bp.b_tile()],
        );
    }

    fn store(this: &mut Self, regs: &Array<Vector<F, N>>, buf: usize) {
        let bp = comptime![this.bp];
        store_tile_regs(
            regs,
            &mut this.a_s,
            buf * comptime![bp.a_tile().stage_len()],
            0usize,
            comptime![bp.a_tile()],
        );
        store_tile_regs(
            regs,
            &mut this.b_s,
            buf * comptime![bp.b_tile().stage_len()],
            comptime![bp.a_tile().per_unit()],
            comptime![bp.b_tile()],
        );
    }

    fn compute(this: &mut Self, buf: usize, _step: usize) {
        compute_step(
            &this.a_s,
            &this.b_s,
            &mut this.accs,
            &mut this.a_frags,
            &mut this.b_frag,
            buf,
            *this.wm,
            *this.wn,
            this.bp,
        );
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
    tiles_m: usize,
    tiles_n: usize,
    #[comptime] bp: CmmaBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    if CUBE_POS >= tiles_m * tiles_n {
        terminate!();
    }
    let (tile_m, tile_n) = grouped_tile(CUBE_POS, tiles_m, tiles_n, bp.group_m);
    let m0 = tile_m * comptime![bp.bm as usize];
    let n0 = tile_n * comptime![bp.out_cols()];
    let plane = UNIT_POS as usize / PLANE;
    let lane = UNIT_POS as usize % PLANE;
    let wm = plane / comptime![bp.warps_n as usize];
    let wn = plane % comptime![bp.warps_n as usize];
    let k_vecs = k / comptime![bp.vector as usize];
    let mut stages = CmmaStages::new(
        x,
        w,
        w_up,
        &m0,
        &n0,
        &m,
        &n_total,
        &k_vecs,
        &up_row_offset,
        &wm,
        &wn,
        bp,
    );
    let steps = k.div_ceil(comptime![bp.bk as usize]);
    if comptime![bp.stages >= 2] {
        run_async_pipeline::<CmmaStages<'_, F, N>>(
            &mut stages,
            steps,
            comptime![bp.stages as usize],
        );
    } else {
        let mut regs =
            Array::<Vector<F, N>>::new(comptime![bp.a_tile().per_unit() + bp.b_tile().per_unit()]);
        run_register_double_buffer::<Vector<F, N>, CmmaStages<'_, F, N>>(
            &mut stages,
            &mut regs,
            steps,
        );
    }

    write_fragments::<F>(
        &stages.accs,
        out,
        bias,
        residual,
        m0 + wm * comptime![bp.plane_rows()],
        n0 + wn * comptime![bp.b_plane_step()],
        m,
        n_total,
        plane,
        lane,
        comptime![bp.grid()],
        bp.epilogue,
    );
}
