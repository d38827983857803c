//! The int4 prefill GEMM on the tensor cores (CUDA, bf16 and f16 activations, M > 16): the
//! `[N, K/8]` weight of [`crate::W4A16Linear`] (see `crate::w4a16_nk`) multiplied as it is
//! stored, without a dequantized copy of the weight in memory, with the layer's whole epilogue
//! (bias, residual, or the gated MLP's activation) in the same kernel.
//!
//! Each cube of 4 warps computes a 128x128 output tile (warps of 64x64, `mma.sync.m16n8k16` with
//! f32 accumulators, fragments loaded by `ldmatrix.x4`) over K steps of 32 through two shared
//! buffers, the next step waiting in registers while the current one is multiplied. x's rows are
//! copied as they are. Each unit loads one weight row of the step (16 bytes, 32 nibbles) and the
//! row's group scale, and after the step's MMAs writes the row into the other buffer as
//! activation-dtype pairs `F(n · s)`, the product taken in f32: the values the dequantizing path
//! stores in memory, so the MMAs see the same operands. A nibble pair becomes an exact bf16 pair
//! in one LOP3 and one packed FMA (`(w >> 4p) & 0x000F000F ^ 0x43084308` is `136 + n` in both
//! halves; minus 136), and each half an f32 in one shift or AND; the scale is applied in f32 and
//! the pair rounded once.
//!
//! Shared rows are 80 bytes (64 + 16 of padding) written in 16-byte vectors: the 8 rows an
//! `ldmatrix` phase reads, and the 8 rows that 8 units store at once, fall in 8 different 16-byte
//! bank groups. On an H200, `ldmatrix` and the 16-byte stores took 4096x4096x4096 from 775 to
//! 612 µs (4-byte shared loads and stores before, the stores 4-way bank-conflicted) and the 1.5B
//! model's 512-token prefill from 48.7k to 54.4k tokens/s.
//!
//! Gated MLP (a `[2I, K/8]` gate-then-up weight): a tile covers 64 output columns, and each
//! warp's 64 B rows are 32 gate rows then the 32 matching up rows, so a lane holds the gate and
//! the up product of the same outputs.
//!
//! Where the tiles are too few to fill the GPU (a 512-token prompt's 1536-wide projections have
//! 48), K is split over up to 8 cubes per tile as in the 8-bit tile kernel
//! ([`crate::gemm8::splits_for`]): each slice writes its raw f32 accumulators to a scratch and a
//! second launch sums them in slice order (so results do not depend on which cube finished
//! first) and applies the epilogue. Only where the caller lets the product allocate, and never
//! for the gated MLP (its tiles are many: the scratch would hold both halves).

use cubecl::cmma::{MatrixIdent, MmaDefinition};
use cubecl::prelude::*;
use ops::gemm::{epilogue_value, EpilogueBlueprint};
use ops::{caps, DType, DeviceTensor, Result};

use crate::w4a16_fragments::{has_mma16, mma_m16n8k16, nibble_pair, pack_pair};
use crate::w4a16_nk::NkEpilogue;

/// Output rows per tile.
const BM: usize = 128;
/// Weight rows per tile (output columns; half as many when gated).
const BN: usize = 128;
/// K per step.
const BK: usize = 32;
/// 16-byte vectors per shared row: 4 (32 values of 2 bytes) + 1 of padding (see the module
/// docs).
const STRIDE: usize = 5;
/// Vectors of one buffer of a 128-row tile.
const STAGE: usize = BM * STRIDE;
/// Units per cube: 4 warps.
const UNITS: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct GemmPlan {
    f16: bool,
    epilogue: EpilogueBlueprint,
    /// Slice `CUBE_POS_Z` of K, raw accumulators to the scratch.
    split: bool,
}

/// Whether [`gemm`] takes `x[.., k]` of `dtype` with scale groups of `group` along K: a runtime
/// with the bf16/f16 MMA, K a multiple of the step, groups of whole steps.
pub(crate) fn can_run<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    k: usize,
    group: usize,
) -> bool {
    k.is_multiple_of(BK)
        && group.is_multiple_of(BK)
        && 2 * 2 * STAGE * 16 <= client.properties().hardware.max_shared_memory_size
        && has_mma16(client, dtype)
}

/// The weight row that B-tile row `t` holds and the output column it feeds. Gated, each warp's
/// 64 rows are 32 gate rows then the matching 32 up rows (`up_offset` rows further down).
#[cube]
fn tile_row(t: usize, n0: usize, up_offset: usize, #[comptime] gated: bool) -> (usize, usize) {
    if comptime![gated] {
        let j = t % 64;
        let col = n0 + (t / 64) * 32 + j % 32;
        (select(j >= 32, up_offset + col, col), col)
    } else {
        (n0 + t, n0 + t)
    }
}

/// This unit's four 16-byte vectors of step `step` of x's 128-row tile (zeros past M).
#[cube]
fn load_x(
    x: &[Vector<u32, Const<4>>],
    regs: &mut Array<Vector<u32, Const<4>>>,
    m0: usize,
    m: usize,
    step: usize,
    row_vecs: usize,
) {
    #[unroll]
    for r in 0..4usize {
        let idx = UNIT_POS as usize + r * UNITS;
        let row = m0 + idx / 4;
        let mut v = Vector::<u32, Const<4>>::new(0u32);
        if row < m {
            v = x[row * row_vecs + step * 4 + idx % 4];
        }
        regs[r] = v;
    }
}

#[cube]
fn store_x(dst: &mut [Vector<u32, Const<4>>], regs: &Array<Vector<u32, Const<4>>>, base: usize) {
    #[unroll]
    for r in 0..4usize {
        let idx = UNIT_POS as usize + r * UNITS;
        dst[base + (idx / 4) * STRIDE + idx % 4] = regs[r];
    }
}

/// Step `step` of weight row `row` (16 bytes) and its group's scale; zeros where the row does
/// not exist.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_w(
    qweight: &[Vector<i32, Const<4>>],
    scales: &[f32],
    row: usize,
    exists: bool,
    step: usize,
    k_steps: usize,
    groups: usize,
    steps_per_group: usize,
) -> (Vector<i32, Const<4>>, f32) {
    let mut v = Vector::<i32, Const<4>>::new(0i32);
    let mut s = 0f32;
    if exists {
        v = qweight[row * k_steps + step];
        s = scales[row * groups + step / steps_per_group];
    }
    (v, s)
}

/// Writes this unit's weight row of a step (`v`, 32 nibbles, 8 consecutive k per word) into
/// shared row `UNIT_POS` at `base` as pairs of `F(n · s)` (k, k + 1), one vector per word.
#[cube]
fn store_w(
    dst: &mut [Vector<u32, Const<4>>],
    v: Vector<i32, Const<4>>,
    s: f32,
    base: usize,
    #[comptime] f16: bool,
) {
    let at = base + UNIT_POS as usize * STRIDE;
    #[unroll]
    for w in 0..4usize {
        let word = v.extract(w);
        let mut vals = Array::<f32>::new(8usize);
        #[unroll]
        for p in 0..4u32 {
            // Exact bf16 `n` whatever the activation dtype: each half widens to f32 in one op.
            let pair = nibble_pair(word, p, false, false);
            vals[p as usize] = f32::reinterpret(pair << 16u32) * s;
            vals[p as usize + 4] = f32::reinterpret(pair & 0xFFFF_0000u32) * s;
        }
        let mut out = Vector::<u32, Const<4>>::new(0u32);
        #[unroll]
        for q in 0..4usize {
            out.insert(q, pack_pair(vals[2 * q], vals[2 * q + 1], f16));
        }
        dst[at + w] = out;
    }
}

/// One step's MMAs of this warp's 64x64 block from the buffers at `cur`, each `ldmatrix.x4`
/// loading four 8x8 matrices: one 16x16 A fragment, or the B fragments of two 8-column blocks.
#[cube]
#[allow(clippy::too_many_arguments)]
fn multiply_step<F: Float>(
    def: &MmaDefinition<F, F, f32>,
    a_s: &[Vector<u32, Const<4>>],
    b_s: &[Vector<u32, Const<4>>],
    acc: &mut Array<Vector<f32, Const<4>>>,
    cur: usize,
    wm: usize,
    wn: usize,
    lane: usize,
    #[comptime] f16: bool,
) {
    // Lane `l` points at row `l % 8` of matrix `l / 8`: A's matrices are (rows 0-7, k 0-7),
    // (8-15, 0-7), (0-7, 8-15), (8-15, 8-15), the MMA's a0..a3; B's (block 0, k 0-7), (block 0,
    // k 8-15), (block 1, k 0-7), (block 1, k 8-15), each block's b0 and b1. A vector is 8 k.
    let a_row = lane % 8 + 8 * ((lane / 8) % 2);
    let a_col = lane / 16;
    let b_row = lane % 8 + 8 * (lane / 16);
    let b_col = (lane / 8) % 2;
    #[unroll]
    for ks in 0..2usize {
        let mut af = Array::<u32>::new(16usize);
        #[unroll]
        for mi in 0..4usize {
            let start = cur + (wm * 64 + mi * 16 + a_row) * STRIDE + ks * 2 + a_col;
            let regs = def.load_matrix::<Vector<u32, Const<4>>, Const<1>>(
                &a_s[start..start + 1],
                MatrixIdent::A,
                4usize,
                false,
            );
            #[unroll]
            for r in 0..4usize {
                af[4 * mi + r] = regs[r].extract(0usize);
            }
        }
        #[unroll]
        for nj in 0..4usize {
            let start = cur + (wn * 64 + nj * 16 + b_row) * STRIDE + ks * 2 + b_col;
            let regs = def.load_matrix::<Vector<u32, Const<4>>, Const<1>>(
                &b_s[start..start + 1],
                MatrixIdent::B,
                4usize,
                false,
            );
            #[unroll]
            for half in 0..2usize {
                let ni = nj * 2 + half;
                let b0 = regs[2 * half].extract(0usize);
                let b1 = regs[2 * half + 1].extract(0usize);
                #[unroll]
                for mi in 0..4usize {
                    acc[mi * 8 + ni] = mma_m16n8k16(
                        af[4 * mi],
                        af[4 * mi + 1],
                        af[4 * mi + 2],
                        af[4 * mi + 3],
                        b0,
                        b1,
                        acc[mi * 8 + ni],
                        f16,
                    );
                }
            }
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn w4a16_gemm_kernel<F: Float>(
    x: &[Vector<u32, Const<4>>],
    qweight: &[Vector<i32, Const<4>>],
    scales: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    partials: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
    steps_per_group: usize,
    up_offset: usize,
    steps_per_split: usize,
    #[comptime] plan: GemmPlan,
    #[define(F)] _dtype: ElemType,
) {
    let gated = comptime![plan.epilogue.is_gated()];
    let f16 = comptime![plan.f16];
    let tid = UNIT_POS as usize;
    let warp = tid / 32;
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    let wm = warp / 2;
    let wn = warp % 2;
    let m0 = CUBE_POS_Y as usize * BM;
    let n0 = CUBE_POS_X as usize * comptime![if gated { BN / 2 } else { BN }];
    let k_steps = k / BK;
    let row_vecs = k / 8;

    // This cube's steps: all of K, or slice `CUBE_POS_Z` of a split.
    let mut first = 0usize;
    let mut last = k_steps;
    if comptime![plan.split] {
        first = CUBE_POS_Z as usize * steps_per_split;
        last = min(last, first + steps_per_split);
    }

    let mut a_s =
        Shared::<[Vector<u32, Const<4>>]>::new_aligned_slice(comptime![2 * STAGE], 16usize);
    let mut b_s =
        Shared::<[Vector<u32, Const<4>>]>::new_aligned_slice(comptime![2 * STAGE], 16usize);
    let mut acc = Array::<Vector<f32, Const<4>>>::new(32usize);
    #[unroll]
    for i in 0..32usize {
        acc[i] = Vector::<f32, Const<4>>::new(0f32);
    }
    let mut xr = Array::<Vector<u32, Const<4>>>::new(4usize);
    let def = MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    let (w_row, w_col) = tile_row(tid, n0, up_offset, gated);
    let w_exists = w_col < n;

    load_x(x, &mut xr, m0, m, first, row_vecs);
    let (v0, s0) = load_w(
        qweight,
        scales,
        w_row,
        w_exists,
        first,
        k_steps,
        groups,
        steps_per_group,
    );
    let mut wv = v0;
    let mut ws = s0;
    store_x(&mut a_s, &xr, 0usize);
    store_w(&mut b_s, wv, ws, 0usize, f16);
    sync_cube();

    for kt in first..last {
        let cur = ((kt - first) % 2) * STAGE;
        let more = kt + 1 < last;
        if more {
            load_x(x, &mut xr, m0, m, kt + 1, row_vecs);
            let (v, s) = load_w(
                qweight,
                scales,
                w_row,
                w_exists,
                kt + 1,
                k_steps,
                groups,
                steps_per_group,
            );
            wv = v;
            ws = s;
        }
        multiply_step::<F>(&def, &a_s, &b_s, &mut acc, cur, wm, wn, lane, f16);
        if more {
            let nxt = STAGE - cur;
            store_x(&mut a_s, &xr, nxt);
            store_w(&mut b_s, wv, ws, nxt, f16);
        }
        sync_cube();
    }

    // Accumulator `mi * 8 + ni` holds rows `gid`, `gid + 8` and columns `2 tig`, `2 tig + 1` of
    // the warp's 16x8 block (mi, ni); gated, blocks ni < 4 are gates and ni + 4 their ups.
    let blocks_n = comptime![if gated { 4usize } else { 8usize }];
    let warp_cols = comptime![if gated { 32usize } else { 64usize }];
    #[unroll]
    for mi in 0..4usize {
        #[unroll]
        for ni in 0..blocks_n {
            let c = acc[mi * 8 + ni];
            let col = n0 + wn * warp_cols + ni * 8 + 2 * tig;
            #[unroll]
            for h in 0..2usize {
                let row = m0 + wm * 64 + mi * 16 + gid + 8 * h;
                #[unroll]
                for e in 0..2usize {
                    if row < m && col + e < n {
                        let value = c.extract(2 * h + e);
                        if comptime![plan.split] {
                            partials[(CUBE_POS_Z as usize * m + row) * n + col + e] = value;
                        } else {
                            let mut up = 0f32;
                            if comptime![gated] {
                                up = acc[mi * 8 + ni + 4].extract(2 * h + e);
                            }
                            out[row * n + col + e] = epilogue_value::<F>(
                                value,
                                up,
                                row,
                                col + e,
                                n,
                                bias,
                                residual,
                                plan.epilogue,
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The split's second launch: output `(row, col)` is the sum of the slices' accumulators, in
/// slice order, through the epilogue.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn w4a16_split_sum_kernel<F: Float>(
    partials: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n: usize,
    splits: usize,
    #[comptime] epilogue: EpilogueBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let mn = m * n;
    let at = ABSOLUTE_POS;
    if at < mn {
        let mut total = partials[at];
        for s in 1..splits {
            total += partials[s * mn + at];
        }
        out[at] = epilogue_value::<F>(total, 0f32, at / n, at % n, n, bias, residual, epilogue);
    }
}

/// The GEMM on validated operands where [`can_run`] holds: `x[M, K]` contiguous bf16/f16,
/// `qweight_nk[N, K/8]` (`[2N, K/8]` when gated), `scales_nk[.., K/group]` f32, `out[M, N]`.
/// `may_allocate`: K may be split, with a scratch allocated for the slices.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    qweight_nk: &DeviceTensor<R>,
    scales_nk: &DeviceTensor<R>,
    group: usize,
    epilogue: NkEpilogue<'_, R>,
    out: &DeviceTensor<R>,
    [m, k, n]: [usize; 3],
    may_allocate: bool,
) -> Result<()> {
    debug_assert!(can_run(client, x.dtype(), k, group));
    let gated = epilogue.gate.is_some();
    let tile_cols = if gated { BN / 2 } else { BN };
    let (nx, ny) = (n.div_ceil(tile_cols), m.div_ceil(BM));
    let steps = k / BK;
    let splits = match may_allocate && !gated {
        true => crate::gemm8::splits_for(nx * ny, steps, caps::num_sms(client) as usize),
        false => 1,
    };
    let per_split = steps.div_ceil(splits);
    // Slices of `per_split` steps: the last may be shorter, none is empty.
    let splits = steps.div_ceil(per_split);
    let partials =
        (splits > 1).then(|| DeviceTensor::<R>::empty(client, &[splits * m * n], DType::F32));
    // Without a split the scratch is never touched: bind the output.
    let scratch = partials.as_ref().unwrap_or(out);
    let (bias, residual, _, _) = epilogue.operands(x);
    let plan = GemmPlan {
        f16: x.dtype() == DType::F16,
        epilogue: epilogue.blueprint(),
        split: splits > 1,
    };
    let up_offset = if gated { n } else { 0 };
    // SAFETY: the operands were validated against M, N and K (x contiguous, 2-byte values, K a
    // multiple of 32: whole 16-byte vectors per row), the scratch holds `splits · M · N` f32,
    // and the kernels stay within them.
    unsafe {
        w4a16_gemm_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(nx as u32, ny as u32, splits as u32),
            CubeDim::new_1d(UNITS as u32),
            BufferArg::from_raw_parts(x.handle().clone(), x.numel() / 2),
            qweight_nk.as_buffer_arg(),
            scales_nk.as_buffer_arg(),
            bias.as_buffer_arg(),
            residual.as_buffer_arg(),
            out.as_buffer_arg(),
            scratch.as_buffer_arg(),
            m,
            n,
            k,
            k / group,
            group / BK,
            up_offset,
            per_split,
            plan,
            x.dtype().elem_type(),
        );
        if let Some(p) = &partials {
            w4a16_split_sum_kernel::launch_unchecked::<R>(
                client,
                ops::launch::cube_count_1d(client, (m * n).div_ceil(256) as u32),
                CubeDim::new_1d(256),
                p.as_buffer_arg(),
                bias.as_buffer_arg(),
                residual.as_buffer_arg(),
                out.as_buffer_arg(),
                m,
                n,
                splits,
                plan.epilogue,
                x.dtype().elem_type(),
            );
        }
    }
    Ok(())
}
