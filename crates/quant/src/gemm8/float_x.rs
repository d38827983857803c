//! The 8-bit decode GEMV on the float activation (CUDA, M <= 16): int8 or e4m3 weights times x
//! on f16 tensor cores, with no activation codes.
//!
//! Why: at decode the product is a stream of weight bytes, and quantizing x per row costs a
//! global reduction (its row maximum) before any code exists, which is a pre-pass launch or a
//! pass over x in every cube ([`super::skinny`]); on an H200 those made the 1.5B model's 8-bit
//! layer as long as its bf16 layer (36.2 against 36.0 µs) for half the weight bytes. The tensor
//! cores do not need 8-bit operands to keep up with one row: every code becomes an exact f16
//! (int8: the byte with its sign bit flipped placed under an f16 exponent by one PRMT,
//! `1024 + 128 + w`, then one packed FMA takes 1152 off a pair; e4m3: one
//! `cvt.rn.f16x2.e4m3x2` per pair, sm_89+), and `mma.sync.m16n8k16` multiplies them with x in
//! f16. Five instructions per four int8 weights (two per four e4m3), no quantize pass, no
//! pre-pass launch: the layer has the launches of the bf16 and W4A16 layers.
//!
//! x in f16, without overflow: a row of `x · g` (the input norm's weight) may exceed f16's
//! range where bf16 would not. Each cube first reduces the row's largest magnitude (and, with
//! the norm, its sum of squares) over its units, then stages `x · g · 2^-e` in shared memory
//! with `2^-e` the power of two that puts that maximum in `[2^13, 2^14)`: exact scaling, one
//! rounding to f16 (11 significant bits, three more than bf16), and `2^e` (with the norm's
//! `1 / rms`) multiplies the row's sums at the end, with the weight's per-channel scale.
//!
//! Layout (as the int4 GEMV [`crate::w4a16_mma`]): the weight is the MMA's A operand, a tile is
//! 16 weight rows = 16 output columns, x its B operand (column `c` is x row `c`; above 8 rows a
//! second MMA takes rows 8..16). A step is 64 k: lane `(gid, tig)` loads 16 bytes (16 k) of its
//! weight rows `gid` and `gid + 8`; byte pair `(4w, 4w + 1)` of its word `w` is the A fragment's
//! k `(2 tig, 2 tig + 1)` and `(4w + 2, 4w + 3)` is `(2 tig + 8, 2 tig + 9)`, and x is staged in
//! natural order as f16 pairs, so the same physical k of x are the B fragment's. The warps of a
//! tile split the steps and meet in shared memory; bias, residual and the gated activation
//! follow as in the dense kernels. One cube per tile group: on an H100 the 1.5B model decoded
//! slower with gate-up's 560 groups walked by one wave of 3 register-capped cubes per SM (W8A8
//! 850 → 829 tok/s) and slower still with down's K split across clusters of two cubes (850 →
//! 792), though down's own time fell 8.3 → 6.6 µs: the next layer's qkv and attention took
//! longer by as much and more.
//!
//! The numbers differ from the codes path's by its activation rounding: here x is rounded once
//! to f16 (after the norm's weight, before its `1 / rms`), there to 8 bits per row.

use cubecl::prelude::*;
use ops::norm::sum_squares;
use ops::reduce::{cube_max, cube_sum, ReducePlan};
use ops::{caps, DType, DeviceTensor};

use crate::layout::words_arg;
use crate::tile_sums::{stash_tile_sums, write_tile_sums};
use crate::w4a16_fragments::{has_mma16, mma_m16n8k16, pack_pair};
// The int4 GEMV's tile of 16 output columns and shared-memory budget (x staged whole up to
// STAGE_MAX_BYTES; 1.5B model: one row of down 17.5 KB, 16 rows of its hidden size 48 KB; larger
// M x K runs on the codes path).
use crate::w4a16_mma::{SmDevice, RED_MAX_BYTES, STAGE_MAX_BYTES, TILE_N};
use crate::w4a16_nk::NkEpilogue;

mod plan;

use plan::{launch_plan, FloatXPlan, Shape, STEP_K};

/// Whether [`gemv_float_x`] takes `x[m, k]` of `dtype` (bf16 or f16) against 8-bit weights of
/// the format `fp8` names: CUDA with the f16 `mma.sync` (and, for e4m3, sm_89's conversions:
/// the runtime that has the e4m3 MMA has them), `m <= 16`, K a whole number of 16-byte weight
/// vectors, and the rows of x within [`STAGE_MAX_BYTES`] of shared memory.
pub(crate) fn can_run<R: Runtime>(
    client: &ComputeClient<R>,
    dtype: DType,
    fp8: bool,
    m: usize,
    k: usize,
) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
        && (1..=16).contains(&m)
        && k > 0
        && k.is_multiple_of(16)
        && m * k.div_ceil(STEP_K) * STEP_K * 2 <= STAGE_MAX_BYTES
        && STAGE_MAX_BYTES + RED_MAX_BYTES + 1024
            <= client.properties().hardware.max_shared_memory_size
        && caps::vector_size_for(client, dtype, 8) == 8
        && has_mma16(client, DType::F16)
        && (!fp8 || super::has_mma8(client, true))
}

/// Two codes of `word` (bytes `2p` and `2p + 1`) as an exact f16 pair, the first in the low
/// half. int8: the sign bits flipped (`w + 128`), PRMT puts each byte under the exponent of
/// 1024 (`0x64`), and one packed FMA takes 1152 off both halves. e4m3: `cvt.rn.f16x2.e4m3x2`
/// (every e4m3 value is an f16).
#[cube]
fn code_pair(word: i32, #[comptime] p: u32, #[comptime] fp8: bool) -> u32 {
    let u = u32::reinterpret(word);
    let d: u32;
    if comptime![fp8] {
        let half = u >> comptime![16 * p];
        gpu_asm!(
            "{{ .reg .b16 h; cvt.u16.u32 h, {w}; cvt.rn.f16x2.e4m3x2 {d}, h; }}",
            w = in(_) half,
            d = out(_) d,
            options(pure, nomem),
        );
    } else {
        // PRMT selector: bytes 2p, 0x64, 2p + 1, 0x64 from low to high.
        let select = 0x4140u32 + comptime![0x0202u32 * p];
        let flipped = u ^ 0x8080_8080u32;
        let magic = 0x6464_6464u32;
        let one = 0x3C00_3C00u32;
        let minus = 0xE480_E480u32;
        gpu_asm!(
            "{{ .reg .b32 t; prmt.b32 t, {a}, {magic}, {sel}; fma.rn.f16x2 {d}, t, {one}, {minus}; }}",
            a = in(_) flipped,
            magic = in(_) magic,
            sel = in(_) select,
            one = in(_) one,
            minus = in(_) minus,
            d = out(_) d,
            options(pure, nomem),
        );
    }
    d
}

/// The powers of two a row is staged with: `[2^-e, 2^e]` such that `top · 2^-e` (the row's
/// largest magnitude) lies in `[2^13, 2^14)`, both normal f32s (a zero or tiny row takes
/// `2^126`, an infinite one stays infinite).
#[cube]
fn stage_scales(top: f32) -> Vector<f32, Const<2>> {
    let exponent = (u32::reinterpret(top) >> 23u32) & 0xFFu32;
    // 2^-e has the biased exponent 127 + 13 - (exponent - 127); kept within 1..=253 so that
    // 2^e (biased 254 - that) is a normal number too.
    let biased = min(max(267u32 - exponent, 1u32), 253u32);
    let mut s = Vector::<f32, Const<2>>::new(0f32);
    s.insert(0usize, f32::reinterpret(biased << 23u32));
    s.insert(1usize, f32::reinterpret((254u32 - biased) << 23u32));
    s
}

/// The weight vectors of one pass of a lane: step `s0 + j · warps` of its two rows (`gid` and
/// `gid + 8` of the tile, and the matching up rows when gated), zeros past K or past the matrix.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_pass(
    w: &[Vector<i32, Const<4>>],
    wr: &mut Array<Vector<i32, Const<4>>>,
    row: usize,
    n: usize,
    s0: usize,
    k_vectors: usize,
    pitch_vectors: usize,
    up_offset: usize,
    #[comptime] plan: FloatXPlan,
) {
    let tig = (UNIT_POS as usize % 32) % 4;
    #[unroll]
    for j in 0..comptime![plan.batch as usize] {
        let v = (s0 + j * comptime![plan.warps as usize]) * 4 + tig;
        #[unroll]
        for half in 0..comptime![plan.halves()] {
            #[unroll]
            for r in 0..2usize {
                let nr = row + 8 * r;
                let mut wv = Vector::<i32, Const<4>>::new(0i32);
                if nr < n && v < k_vectors {
                    wv = w[(nr + half * up_offset) * pitch_vectors + v];
                }
                wr[(j * comptime![plan.halves()] + half) * 2 + r] = wv;
            }
        }
    }
}

/// Cube: `tiles` tiles of 16 output columns, `warps` warps each (over interleaved steps). Unit
/// (warp, lane = 4 gid + tig): loads weight rows `gid` and `gid + 8` of its tile and x row `gid`
/// (above 8 rows also `gid + 8`) from the staged copy, and accumulates the outputs of those two
/// weight rows for x rows `2 tig` and `2 tig + 1` (above 8 rows also `+ 8`).
#[cube(launch_unchecked)]
// A comptime condition stays apart from the runtime one it guards (`collapsible_if`).
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn float_x_kernel<F: Float, NX: Size>(
    x: &[Vector<F, NX>],
    w: &[Vector<i32, Const<4>>],
    w_scale: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    norm_w: &[Vector<F, NX>],
    n: usize,
    k: usize,
    pitch_vectors: usize,
    up_offset: usize,
    inv_k: f32,
    eps: f32,
    #[comptime] plan: FloatXPlan,
    #[define(F)] _dtype: ElemType,
) {
    let m_rows = comptime![plan.m as usize];
    let warps = comptime![plan.warps as usize];
    let halves = comptime![plan.halves()];
    let x_halves = comptime![plan.x_halves()];
    let batch = comptime![plan.batch as usize];
    let row_words = comptime![plan.row_words as usize];
    let tid = UNIT_POS as usize;
    let warp = (tid / 32) % warps;
    let tile = tid / (32 * warps);
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    let group = CUBE_POS;
    let row = (group * comptime![plan.tiles as usize] + tile) * TILE_N + gid;
    let k_vectors = k / 16;
    let steps = k_vectors.div_ceil(4);
    let per_pass = warps * batch;
    let passes = steps.div_ceil(per_pass);

    let mut wr =
        Array::<Vector<i32, Const<4>>>::new(comptime![2 * plan.batch as usize * plan.halves()]);
    load_pass(
        w,
        &mut wr,
        row,
        n,
        warp,
        k_vectors,
        pitch_vectors,
        up_offset,
        plan,
    );
    if comptime![plan.early_wait] {
        if comptime![plan.trigger] {
            gpu_asm!("griddepcontrol.launch_dependents;");
        }
        // Only weights were read so far (never written by any kernel): w, w_scale, bias and
        // norm_w are the parameters read before the wait (`ops::pdl`).
        gpu_asm!("// cubellm.early_params 1 2 3 6");
        gpu_asm!("griddepcontrol.wait;");
    }

    // Each row's statistics over the cube: its largest |x · g| (the staging scale) and, with
    // the norm, its sum of squares. `post[r]` is what the row's sums are multiplied by at the
    // end: `2^e`, and the norm's `1 / rms`.
    let x_words = k / 8;
    let mut pre = Array::<f32>::new(m_rows);
    let mut post = Array::<f32>::new(m_rows);
    #[unroll]
    for r in 0..m_rows {
        let mut top = 0f32;
        let mut squares = 0f32;
        for i in range_stepped(tid, x_words, CUBE_DIM as usize) {
            let xv = x[r * x_words + i];
            let mut xf = Vector::<f32, NX>::cast_from(xv);
            if comptime![plan.norm] {
                squares += sum_squares(xv);
                xf *= Vector::<f32, NX>::cast_from(norm_w[i]);
            }
            #[unroll]
            for e in 0..xf.vector_size() {
                top = max(top, f32::abs(xf.extract(e)));
            }
        }
        let scales = stage_scales(cube_max(top, plan.reduce));
        pre[r] = scales.extract(0usize);
        post[r] = scales.extract(1usize);
        if comptime![plan.norm] {
            post[r] *= f32::inverse_sqrt(cube_sum(squares, plan.reduce) * inv_k + eps);
        }
    }
    // x staged as f16 pairs in natural k order (word `i` of a row: k = 8i..8i + 8), zeros past
    // K; the second pass reads x from L1.
    let mut xs =
        Shared::<[Vector<u32, Const<4>>]>::new_slice(comptime![(plan.m * plan.row_words) as usize]);
    #[unroll]
    for r in 0..m_rows {
        for i in range_stepped(tid, row_words, CUBE_DIM as usize) {
            let mut packed = Vector::<u32, Const<4>>::new(0u32);
            if i < x_words {
                let mut xf = Vector::<f32, NX>::cast_from(x[r * x_words + i]);
                if comptime![plan.norm] {
                    xf *= Vector::<f32, NX>::cast_from(norm_w[i]);
                }
                xf *= Vector::new(pre[r]);
                #[unroll]
                for p in 0..4usize {
                    packed.insert(p, pack_pair(xf.extract(2 * p), xf.extract(2 * p + 1), true));
                }
            }
            xs[r * row_words + i] = packed;
        }
    }
    sync_cube();

    // The MMA's B column gid is x row gid (rows past M read x row 0: their outputs are never
    // written); above 8 rows a second MMA takes x rows 8..16. Two chains per (half, x half):
    // words 0 and 2 of a vector, and 1 and 3.
    let lo_base = select(gid < m_rows, gid, 0) * row_words;
    let hi_base = select(gid + 8 < m_rows, gid + 8, 0) * row_words;
    let sums = comptime![plan.tile_sums()];
    let mut red = Shared::<[f32]>::new_slice(comptime![sums.shared_len()]);
    let mut d = Array::<Vector<f32, Const<4>>>::new(comptime![2 * plan.halves() * plan.x_halves()]);
    #[unroll]
    for i in 0..comptime![2 * plan.halves() * plan.x_halves()] {
        d[i] = Vector::<f32, Const<4>>::new(0f32);
    }
    for p in 0..passes {
        if p > 0 {
            load_pass(
                w,
                &mut wr,
                row,
                n,
                p * per_pass + warp,
                k_vectors,
                pitch_vectors,
                up_offset,
                plan,
            );
        }
        #[unroll]
        for j in 0..batch {
            let s = p * per_pass + j * warps + warp;
            if s < steps {
                // This lane's 16 k of the step: staged words 2 tig and 2 tig + 1.
                let xw = s * 8 + tig * 2;
                let mut xv = Array::<Vector<u32, Const<4>>>::new(comptime![2 * plan.x_halves()]);
                xv[0] = xs[lo_base + xw];
                xv[1] = xs[lo_base + xw + 1];
                if comptime![plan.x_halves() == 2] {
                    xv[2] = xs[hi_base + xw];
                    xv[3] = xs[hi_base + xw + 1];
                }
                #[unroll]
                for word in 0..4usize {
                    let ww = comptime![word];
                    #[unroll]
                    for half in 0..halves {
                        let i = (j * halves + half) * 2;
                        let lo = wr[i].extract(word);
                        let hi = wr[i + 1].extract(word);
                        // A fragment: row gid's pairs in a0 and a2, row gid + 8's in a1 and a3.
                        // Held in a vector: an asm output used directly as another asm's input
                        // stays a mutable variable, which the C++ backend passes by address
                        // (ptxas: "Arguments mismatch for instruction 'mma'").
                        let mut a = Vector::<u32, Const<4>>::new(0u32);
                        a.insert(0usize, code_pair(lo, 0u32, comptime![plan.fp8]));
                        a.insert(1usize, code_pair(hi, 0u32, comptime![plan.fp8]));
                        a.insert(2usize, code_pair(lo, 1u32, comptime![plan.fp8]));
                        a.insert(3usize, code_pair(hi, 1u32, comptime![plan.fp8]));
                        #[unroll]
                        for xh in 0..x_halves {
                            let di = (half * x_halves + xh) * 2 + comptime![ww % 2];
                            let staged = xv[2 * xh + comptime![ww / 2]];
                            d[di] = mma_m16n8k16(
                                a.extract(0usize),
                                a.extract(1usize),
                                a.extract(2usize),
                                a.extract(3usize),
                                staged.extract(comptime![2 * (ww % 2)]),
                                staged.extract(comptime![2 * (ww % 2) + 1]),
                                d[di],
                                true,
                            );
                        }
                    }
                }
            }
        }
    }
    if comptime![plan.trigger && !plan.early_wait] {
        gpu_asm!("griddepcontrol.launch_dependents;");
    }

    // The two chains' sums, then the tile's warps summed in warp order.
    let mut acc = Array::<f32>::new(comptime![4 * plan.halves() * plan.x_halves()]);
    #[unroll]
    for c in 0..comptime![plan.halves() * plan.x_halves()] {
        #[unroll]
        for e in 0..4usize {
            acc[4 * c + e] = d[2 * c].extract(e) + d[2 * c + 1].extract(e);
        }
    }
    stash_tile_sums(&mut red, &acc, tile, warp, sums);
    sync_cube();
    write_tile_sums::<F>(
        &red,
        out,
        bias,
        residual,
        &post,
        w_scale,
        group,
        n,
        up_offset,
        sums,
        true,
        true,
        plan.epilogue,
    );
}

/// The GEMV on validated operands where [`can_run`] holds: `x[M, K]` contiguous bf16/f16, `w` an
/// 8-bit `[N, K]` padded matrix (`[2N, K]`: gate rows then up rows when gated) of row pitch
/// `pitch` bytes with per-row scales `w_scale`, `out[M, N]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv_float_x<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    pitch: usize,
    w_scale: &DeviceTensor<R>,
    fp8: bool,
    epilogue: NkEpilogue<'_, R>,
    out: &DeviceTensor<R>,
    [m, k, n]: [usize; 3],
) {
    debug_assert!(can_run(client, x.dtype(), fp8, m, k));
    let gated = epilogue.gate.is_some();
    let device = SmDevice::of(client);
    let shape = Shape {
        m,
        k,
        n,
        fp8,
        epilogue: epilogue.blueprint(),
        norm: epilogue.norm.is_some(),
    };
    let (plan, units, cubes) = launch_plan(shape, device, |units| ReducePlan::new(client, units));
    let (bias, residual, norm_w, eps) = epilogue.operands(x);
    let up_offset = if gated { n } else { 0 };
    // SAFETY: the operands were validated by the caller against M, N and K (the padded weight
    // rows hold `pitch / 16` vectors, every index stays below N rows, or 2N when gated), and
    // `can_run` bounds the shared memory.
    unsafe {
        let words = words_arg(w);
        float_x_kernel::launch_unchecked::<R>(
            client,
            ops::launch::cube_count_1d(client, cubes),
            CubeDim::new_1d(units),
            8usize,
            x.as_buffer_arg(),
            words,
            w_scale.as_buffer_arg(),
            bias.as_buffer_arg(),
            residual.as_buffer_arg(),
            out.as_buffer_arg(),
            norm_w.as_buffer_arg(),
            n,
            k,
            pitch / 16,
            up_offset,
            1.0 / k as f32,
            eps,
            plan,
            x.dtype().elem_type(),
        );
    }
}

#[cfg(test)]
mod cuda_source;
