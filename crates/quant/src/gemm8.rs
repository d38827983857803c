//! The 8-bit GEMM shared by W8A8 (int8 × int8 → i32) and FP8 (e4m3 × e4m3 → f32):
//! `out[m, n] = acc[m, n] · sa[m] · sb[n] (+ bias[n])` with `acc = Σ_k A[m, k] · B[n, k]`,
//! both operands padded 8-bit matrices with K contiguous ("NT", see [`crate::layout`]).
//!
//! Three kernels:
//! - **Tensor cores (CUDA, sm_80+ for int8, sm_89+ for e4m3)**, the default there: warp-level
//!   `mma.sync.m16n8k32` (`.s32.s8.s8.s32` / `.f32.e4m3.e4m3.f32`). CubeCL 0.11.0-pre.3 reports
//!   these shapes in `features.matmul.mma` and accepts i8 in `cmma` (wmma) too, but its manual-MMA
//!   lowering tags every fp8 MMA `.kind::f8f6f4`, a qualifier that only exists on sm_120a; so the
//!   instruction is issued with `gpu_asm!` in the sm_89 form, and int8 goes the same way for
//!   symmetry. Operands stay 32-bit words end to end (4 codes per register, the PTX fragment
//!   layout), so no 8-bit CubeCL type is ever materialised.
//!   - M > 16: block tile 128x128x32 bytes, 4 warps of 64x64, double-buffered shared memory
//!     filled with 16-byte loads, conflict-free fragment reads (row stride of 12 words).
//!   - M <= 16 (decode): m16n8 output tiles, K split over up to 8 warps per tile where the
//!     tiles are few, operands loaded straight from global memory into fragments (no
//!     shared-memory staging), the K slices summed at the end.
//! - **Portable (every runtime, wgpu included)**: a shared-memory tiled SIMT kernel over 32-bit
//!   words (64x64 tile, 4x4 outputs per unit), decoding bytes with integer ops; i32 accumulation
//!   for int8 (exact), f32 for fp8 (every e4m3 product is exact in f32).
//!
//! Bytes of a row past K are masked in the loaders, so the padding's content never matters.

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind, IntKind};
use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

use crate::format::QuantFormat;

use crate::codec::{decode_e4m3, sext_byte};
use crate::layout::words_arg;
use crate::rowquant::{encode_word, row_scale, RowQuantPlan};

/// Which kernel runs the 8-bit GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KernelChoice {
    /// The tensor-core kernels where the runtime has the instruction (see [`has_mma8`]): the
    /// split-K skinny kernel for M <= 16, the 128x128 tile kernel above; the portable kernel
    /// elsewhere (wgpu, older GPUs).
    #[default]
    Auto,
    /// The portable SIMT kernel on every runtime (CUDA included).
    Portable,
}

/// Validated operands of one 8-bit GEMM.
pub(crate) struct Gemm8<'a, R: Runtime> {
    pub a: &'a DeviceTensor<R>,
    pub a_pitch: usize,
    pub b: &'a DeviceTensor<R>,
    pub b_pitch: usize,
    pub sa: &'a DeviceTensor<R>,
    pub sa_scalar: bool,
    pub sb: &'a DeviceTensor<R>,
    pub sb_scalar: bool,
    pub bias: Option<&'a DeviceTensor<R>>,
    /// `[M, N]` of the output dtype, added in the epilogue; never aliases `out`.
    pub residual: Option<&'a DeviceTensor<R>>,
    /// `[M, N]` contiguous, float.
    pub out: &'a DeviceTensor<R>,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub fp8: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct EpiloguePlan {
    pub fp8: bool,
    pub sa_scalar: bool,
    pub sb_scalar: bool,
    pub has_bias: bool,
    pub has_residual: bool,
}

/// Whether the runtime runs warp-level `mma.sync.m16n8k32` for this operand type.
pub fn has_mma8<R: Runtime>(client: &ComputeClient<R>, fp8: bool) -> bool {
    let t = if fp8 {
        ElemType::Float(FloatKind::E4M3)
    } else {
        ElemType::Int(IntKind::I8)
    };
    let cd = if fp8 {
        ElemType::Float(FloatKind::F32)
    } else {
        ElemType::Int(IntKind::I32)
    };
    let hw = &client.properties().hardware;
    caps::runtime_name(client).contains("cuda")
        && hw.plane_size_min == 32
        && hw.plane_size_max == 32
        && client.features().matmul.mma.contains(&MmaConfig {
            a_type: t,
            b_type: t,
            cd_type: cd,
            m: 16,
            n: 8,
            k: 32,
        })
}

// -------------------------------------------------------------------------------------------
// Shared pieces
// -------------------------------------------------------------------------------------------

/// Keeps the bytes of word `w` (starting at byte `start` of its row) that lie before `k`.
#[cube]
pub(crate) fn mask_word(w: i32, start: usize, k: usize) -> i32 {
    let mut out = w;
    if start + 4 > k {
        let mut valid = 0usize;
        if start < k {
            valid = k - start;
        }
        let mask = (1u32 << (8 * valid) as u32) - 1u32;
        out = i32::reinterpret(u32::reinterpret(w) & mask);
    }
    out
}

/// The dequantizing epilogue for one output element of an `[M, n]` output.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn epilogue<F: Float>(
    acc: f32,
    row: usize,
    col: usize,
    n: usize,
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    #[comptime] plan: EpiloguePlan,
) -> F {
    let a = if comptime![plan.sa_scalar] {
        sa[0]
    } else {
        sa[row]
    };
    epilogue_scaled::<F>(acc * a, row, col, n, sb, bias, residual, plan)
}

/// The epilogue after the activation scale: `acc_a · sb[col] (+ bias[col]) (+ residual[row, col])`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn epilogue_scaled<F: Float>(
    acc_a: f32,
    row: usize,
    col: usize,
    n: usize,
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    #[comptime] plan: EpiloguePlan,
) -> F {
    let b = if comptime![plan.sb_scalar] {
        sb[0]
    } else {
        sb[col]
    };
    let mut y = acc_a * b;
    if comptime![plan.has_bias] {
        y += f32::cast_from(bias[col]);
    }
    if comptime![plan.has_residual] {
        y += f32::cast_from(residual[row * n + col]);
    }
    F::cast_from(y)
}

/// Byte `j` of `w` decoded to the accumulator type.
#[cube]
fn decode_byte<Acc: Numeric>(w: i32, #[comptime] j: u32, #[comptime] fp8: bool) -> Acc {
    if comptime![fp8] {
        let c = (u32::reinterpret(w) >> comptime![8 * j]) & 0xFFu32;
        Acc::cast_from(decode_e4m3(c))
    } else {
        Acc::cast_from(sext_byte(w, j))
    }
}

// -------------------------------------------------------------------------------------------
// Portable kernel
// -------------------------------------------------------------------------------------------

const S_TILE: usize = 64;
const S_BKW: usize = 8; // words (32 bytes) of K per stage
const S_STRIDE: usize = S_BKW + 1;

#[cube(launch_unchecked)]
fn gemm8_simt_kernel<F: Float, Acc: Numeric>(
    a: &[i32],
    b: &[i32],
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n: usize,
    k: usize,
    a_pw: usize,
    b_pw: usize,
    #[comptime] plan: EpiloguePlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let tid = ty * 16 + tx;
    let m0 = CUBE_POS_Y as usize * S_TILE;
    let n0 = CUBE_POS_X as usize * S_TILE;
    let mut a_s = Shared::<[i32]>::new_slice(comptime![S_TILE * S_STRIDE]);
    let mut b_s = Shared::<[i32]>::new_slice(comptime![S_TILE * S_STRIDE]);
    let mut acc = Array::<Acc>::new(16usize);
    #[unroll]
    for i in 0..16usize {
        acc[i] = Acc::from_int(0);
    }
    let kw_total = k.div_ceil(4);
    for kt in range_stepped(0usize, kw_total, S_BKW) {
        #[unroll]
        for r in 0..2usize {
            let idx = tid + r * 256;
            let row = idx / S_BKW;
            let w = idx % S_BKW;
            let kw = kt + w;
            let mut va = 0i32;
            let mut vb = 0i32;
            if kw < kw_total {
                if m0 + row < m {
                    va = mask_word(a[(m0 + row) * a_pw + kw], kw * 4, k);
                }
                if n0 + row < n {
                    vb = mask_word(b[(n0 + row) * b_pw + kw], kw * 4, k);
                }
            }
            a_s[row * S_STRIDE + w] = va;
            b_s[row * S_STRIDE + w] = vb;
        }
        sync_cube();
        // Not unrolled: the body is already 64 multiply-adds, and unrolling it 8x makes a shader
        // that software Vulkan takes many seconds to compile.
        for w in 0..S_BKW {
            let mut aw = Array::<i32>::new(4usize);
            let mut bw = Array::<i32>::new(4usize);
            #[unroll]
            for i in 0..4usize {
                aw[i] = a_s[(ty + 16 * i) * S_STRIDE + w];
                bw[i] = b_s[(tx + 16 * i) * S_STRIDE + w];
            }
            #[unroll]
            for byte in 0..4u32 {
                let mut av = Array::<Acc>::new(4usize);
                #[unroll]
                for i in 0..4usize {
                    av[i] = decode_byte::<Acc>(aw[i], byte, plan.fp8);
                }
                #[unroll]
                for j in 0..4usize {
                    let bv = decode_byte::<Acc>(bw[j], byte, plan.fp8);
                    #[unroll]
                    for i in 0..4usize {
                        acc[i * 4 + j] += av[i] * bv;
                    }
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for i in 0..4usize {
        #[unroll]
        for j in 0..4usize {
            let row = m0 + ty + 16 * i;
            let col = n0 + tx + 16 * j;
            if row < m && col < n {
                out[row * n + col] = epilogue::<F>(
                    f32::cast_from(acc[i * 4 + j]),
                    row,
                    col,
                    n,
                    sa,
                    sb,
                    bias,
                    residual,
                    plan,
                );
            }
        }
    }
}

// -------------------------------------------------------------------------------------------
// Tensor-core kernel (CUDA)
// -------------------------------------------------------------------------------------------

const T_BM: usize = 128;
const T_BN: usize = 128;
const T_STRIDE: usize = 12; // words per shared row: 8 + 4 of padding (conflict-free fragments)
const T_STAGE: usize = T_BM * T_STRIDE;

/// One warp-level `mma.sync.m16n8k32` on 8-bit codes packed four per register. Operands are
/// scalars, not vectors: CubeCL 0.11.0-pre.3 hands a *mutable* vector variable to inline PTX
/// by its address (a 64-bit operand, which `mma` rejects with "Arguments mismatch").
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_m16n8k32<Acc: Numeric>(
    a0: i32,
    a1: i32,
    a2: i32,
    a3: i32,
    b0: i32,
    b1: i32,
    c: Vector<Acc, Const<4>>,
    #[comptime] fp8: bool,
) -> Vector<Acc, Const<4>> {
    let d: Vector<Acc, Const<4>>;
    if comptime![fp8] {
        gpu_asm!(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {c};",
            a0 = in(_) a0,
            a1 = in(_) a1,
            a2 = in(_) a2,
            a3 = in(_) a3,
            b0 = in(_) b0,
            b1 = in(_) b1,
            c = in(_) c,
            d = out(_) d,
            options(nomem),
        );
    } else {
        gpu_asm!(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {c};",
            a0 = in(_) a0,
            a1 = in(_) a1,
            a2 = in(_) a2,
            a3 = in(_) a3,
            b0 = in(_) b0,
            b1 = in(_) b1,
            c = in(_) c,
            d = out(_) d,
            options(nomem),
        );
    }
    d
}

/// Loads this thread's two 16-byte vectors of a 128-row × 32-byte tile into registers (zeros
/// outside the matrix, bytes past K masked).
#[cube]
fn load_tile(
    src: &[Vector<i32, Const<4>>],
    row0: usize,
    rows: usize,
    k0: usize,
    k: usize,
    pitch_vecs: usize,
    tid: usize,
    regs: &mut Array<Vector<i32, Const<4>>>,
    #[comptime] base: usize,
) {
    #[unroll]
    for r in 0..2usize {
        let idx = tid + r * 128;
        let row = idx / 2;
        let v = idx % 2;
        let byte = k0 + v * 16;
        let mut val = Vector::<i32, Const<4>>::new(0i32);
        if row0 + row < rows && byte < k {
            val = src[(row0 + row) * pitch_vecs + byte / 16];
            if byte + 16 > k {
                #[unroll]
                for i in 0..4usize {
                    val.insert(i, mask_word(val.extract(i), byte + 4 * i, k));
                }
            }
        }
        regs[base + r] = val;
    }
}

#[cube]
fn store_tile(
    dst: &mut [i32],
    tid: usize,
    regs: &Array<Vector<i32, Const<4>>>,
    offset: usize,
    #[comptime] base: usize,
) {
    #[unroll]
    for r in 0..2usize {
        let idx = tid + r * 128;
        let row = idx / 2;
        let v = idx % 2;
        let val = regs[base + r];
        #[unroll]
        for i in 0..4usize {
            dst[offset + row * T_STRIDE + v * 4 + i] = val.extract(i);
        }
    }
}

#[cube(launch_unchecked)]
fn gemm8_mma_kernel<F: Float, Acc: Numeric>(
    a: &[Vector<i32, Const<4>>],
    b: &[Vector<i32, Const<4>>],
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n: usize,
    k: usize,
    a_pv: usize,
    b_pv: usize,
    #[comptime] plan: EpiloguePlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let tid = UNIT_POS as usize;
    let warp = tid / 32;
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    let wm = warp / 2;
    let wn = warp % 2;
    let m0 = CUBE_POS_Y as usize * T_BM;
    let n0 = CUBE_POS_X as usize * T_BN;

    let mut a_s = Shared::<[i32]>::new_slice(comptime![2 * T_STAGE]);
    let mut b_s = Shared::<[i32]>::new_slice(comptime![2 * T_STAGE]);
    let mut acc = Array::<Vector<Acc, Const<4>>>::new(32usize);
    #[unroll]
    for i in 0..32usize {
        acc[i] = Vector::<Acc, Const<4>>::new(Acc::from_int(0));
    }
    let mut regs = Array::<Vector<i32, Const<4>>>::new(4usize);

    let k_tiles = k.div_ceil(32);
    load_tile(a, m0, m, 0, k, a_pv, tid, &mut regs, 0usize);
    load_tile(b, n0, n, 0, k, b_pv, tid, &mut regs, 2usize);
    store_tile(&mut a_s, tid, &regs, 0usize, 0usize);
    store_tile(&mut b_s, tid, &regs, 0usize, 2usize);
    sync_cube();

    for kt in 0..k_tiles {
        let cur = (kt % 2) * T_STAGE;
        let nxt = ((kt + 1) % 2) * T_STAGE;
        let more = kt + 1 < k_tiles;
        if more {
            load_tile(a, m0, m, (kt + 1) * 32, k, a_pv, tid, &mut regs, 0usize);
            load_tile(b, n0, n, (kt + 1) * 32, k, b_pv, tid, &mut regs, 2usize);
        }
        let mut af = Array::<i32>::new(16usize);
        #[unroll]
        for mi in 0..4usize {
            let r = cur + (wm * 64 + mi * 16 + gid) * T_STRIDE + tig;
            af[4 * mi] = a_s[r];
            af[4 * mi + 1] = a_s[r + 8 * T_STRIDE];
            af[4 * mi + 2] = a_s[r + 4];
            af[4 * mi + 3] = a_s[r + 8 * T_STRIDE + 4];
        }
        #[unroll]
        for ni in 0..8usize {
            let r = cur + (wn * 64 + ni * 8 + gid) * T_STRIDE + tig;
            let b0 = b_s[r];
            let b1 = b_s[r + 4];
            #[unroll]
            for mi in 0..4usize {
                acc[mi * 8 + ni] = mma_m16n8k32::<Acc>(
                    af[4 * mi],
                    af[4 * mi + 1],
                    af[4 * mi + 2],
                    af[4 * mi + 3],
                    b0,
                    b1,
                    acc[mi * 8 + ni],
                    plan.fp8,
                );
            }
        }
        if more {
            store_tile(&mut a_s, tid, &regs, nxt, 0usize);
            store_tile(&mut b_s, tid, &regs, nxt, 2usize);
        }
        sync_cube();
    }

    #[unroll]
    for mi in 0..4usize {
        #[unroll]
        for ni in 0..8usize {
            let c = acc[mi * 8 + ni];
            let col = n0 + wn * 64 + ni * 8 + 2 * tig;
            #[unroll]
            for h in 0..2usize {
                let row = m0 + wm * 64 + mi * 16 + gid + 8 * h;
                #[unroll]
                for e in 0..2usize {
                    if row < m && col + e < n {
                        out[row * n + col + e] = epilogue::<F>(
                            f32::cast_from(c.extract(2 * h + e)),
                            row,
                            col + e,
                            n,
                            sa,
                            sb,
                            bias,
                            residual,
                            plan,
                        );
                    }
                }
            }
        }
    }
}

// -------------------------------------------------------------------------------------------
// Skinny tensor-core kernel (CUDA, M <= 16: decode)
// -------------------------------------------------------------------------------------------

/// Rows of A the skinny kernel takes: one m16 MMA tile.
pub(crate) const SKINNY_MAX_M: usize = 16;
/// 64-byte K chunks a skinny-kernel warp loads per step (4 measured slower on an H100: gate_up
/// 11.7 -> 16.8 µs at M = 1).
const CHUNKS_PER_STEP: usize = 2;
/// Bytes of activation codes the fused skinny kernel stages in shared memory (rows x padded K):
/// up to this, the linear layers quantize the activation inside the GEMM instead of a pre-pass.
pub(crate) const FUSED_MAX_CODE_BYTES: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SkinnyPlan {
    pub epi: EpiloguePlan,
    /// Warps per output tile; they split K.
    pub warps: u32,
    /// Output tiles (of 8 columns) per cube.
    pub tiles: u32,
    /// Quantize x in the kernel: every cube computes the row scales and stages the codes in
    /// shared memory (the same functions as the pre-pass, so the same bytes), saving a launch.
    pub fused: bool,
    /// How the fused kernel reads and encodes x.
    pub rows: RowQuantPlan,
}

/// Loads 16 bytes of row `row` at byte `byte` (zeros past the matrix, bytes past K masked: an
/// fp8 padding byte could be a NaN code).
#[cube]
fn load_vec(
    src: &[Vector<i32, Const<4>>],
    row: usize,
    valid: bool,
    byte: usize,
    k: usize,
    pitch_vecs: usize,
) -> Vector<i32, Const<4>> {
    let mut val = Vector::<i32, Const<4>>::new(0i32);
    if valid && byte < k {
        val = src[row * pitch_vecs + byte / 16];
        if byte + 16 > k {
            #[unroll]
            for i in 0..4usize {
                val.insert(i, mask_word(val.extract(i), byte + 4 * i, k));
            }
        }
    }
    val
}

/// The same 16 bytes from the codes the fused kernel staged (already zero past K).
#[cube]
fn load_staged(
    codes: &[i32],
    row: usize,
    valid: bool,
    byte: usize,
    k: usize,
    pitch_words: usize,
) -> Vector<i32, Const<4>> {
    let mut val = Vector::<i32, Const<4>>::new(0i32);
    if valid && byte < k {
        #[unroll]
        for i in 0..4usize {
            val.insert(i, codes[row * pitch_words + byte / 4 + i]);
        }
    }
    val
}

/// `out[m, n0..n0 + 8]` for all `m < M <= 16`: one m16n8 output tile per cube, its K split over
/// the cube's warps and summed through shared memory. Each thread loads 16 contiguous bytes of
/// one weight row per 64-byte K chunk (a warp reads 8 rows x 64 bytes: whole sectors) and the
/// same bytes of activation rows `gid` and `gid + 8`. The MMA's k order is a permutation of the
/// physical bytes (word 0/1 of a thread's vector feed the first MMA, 2/3 the second), the same
/// for A and B, so the dot products are unchanged. Bandwidth-bound: the tensor cores only spare
/// the ALUs the byte decoding (15 of 16 MMA rows are padding at M = 1, and that is free).
#[cube(launch_unchecked)]
fn gemm8_skinny_kernel<F: Float, Acc: Numeric, NX: Size>(
    a: &[Vector<i32, Const<4>>],
    x: &[Vector<F, NX>],
    b: &[Vector<i32, Const<4>>],
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n: usize,
    k: usize,
    a_pv: usize,
    b_pv: usize,
    #[comptime] plan: SkinnyPlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let warps = comptime![plan.warps as usize];
    let tid = UNIT_POS as usize;
    let warp = (tid / 32) % warps;
    let tile = tid / (32 * warps);
    let lane = tid % 32;
    let gid = lane / 4;
    let tig = lane % 4;
    let n0 = (CUBE_POS * comptime![plan.tiles as usize] + tile) * 8;
    let col_ok = n0 + gid < n;
    let col = select(col_ok, n0 + gid, 0);
    let lo_ok = gid < m;
    let hi_ok = gid + 8 < m;

    let pitch_words = a_pv * 4;
    let mut codes = Shared::<[i32]>::new_slice(comptime![if plan.fused {
        FUSED_MAX_CODE_BYTES / 4
    } else {
        1
    }]);
    let mut scales = Shared::<[f32]>::new_slice(SKINNY_MAX_M);
    if comptime![plan.fused] {
        for r in 0..m {
            let s = row_scale::<F, NX>(x, r, k, plan.rows);
            if tid == 0 {
                scales[r] = s;
            }
            for w in range_stepped(tid, pitch_words, CUBE_DIM as usize) {
                codes[r * pitch_words + w] =
                    i32::reinterpret(encode_word::<F, NX>(x, r, w, k, s, plan.rows));
            }
        }
        sync_cube();
    }

    let mut acc = Array::<Vector<Acc, Const<4>>>::new(1usize);
    acc[0] = Vector::<Acc, Const<4>>::new(Acc::from_int(0));
    let chunks = k.div_ceil(64);
    // CHUNKS_PER_STEP chunks per step, all loaded before any is multiplied: more bytes in
    // flight (a loop iteration's loads are otherwise one memory latency each).
    for c in range_stepped(warp, chunks, CHUNKS_PER_STEP * warps) {
        let mut words = Array::<Vector<i32, Const<4>>>::new(comptime![3 * CHUNKS_PER_STEP]);
        #[unroll]
        for h in 0..CHUNKS_PER_STEP {
            let byte = (c + h * warps) * 64 + tig * 16;
            words[3 * h] = load_vec(b, col, col_ok, byte, k, b_pv);
            if comptime![plan.fused] {
                words[3 * h + 1] = load_staged(&codes, gid, lo_ok, byte, k, pitch_words);
                words[3 * h + 2] = load_staged(&codes, gid + 8, hi_ok, byte, k, pitch_words);
            } else {
                words[3 * h + 1] = load_vec(a, gid, lo_ok, byte, k, a_pv);
                words[3 * h + 2] = load_vec(a, gid + 8, hi_ok, byte, k, a_pv);
            }
        }
        #[unroll]
        for h in 0..CHUNKS_PER_STEP {
            let bw = words[3 * h];
            let lo = words[3 * h + 1];
            let hi = words[3 * h + 2];
            #[unroll]
            for half in 0..2usize {
                acc[0] = mma_m16n8k32::<Acc>(
                    lo.extract(2 * half),
                    hi.extract(2 * half),
                    lo.extract(2 * half + 1),
                    hi.extract(2 * half + 1),
                    bw.extract(2 * half),
                    bw.extract(2 * half + 1),
                    acc[0],
                    plan.epi.fp8,
                );
            }
        }
    }

    // acc[0] holds C[gid][2 tig + e] (e = 0, 1) and C[gid + 8][2 tig + e] (e = 2, 3).
    let mut red = Shared::<[Acc]>::new_slice(comptime![(plan.warps * plan.tiles) as usize * 128]);
    let cv = acc[0];
    #[unroll]
    for e in 0..4usize {
        let r = gid + 8 * (e / 2);
        red[(tid / 32) * 128 + r * 8 + 2 * tig + e % 2] = cv.extract(e);
    }
    sync_cube();
    // Tiles x 128 outputs, more than the cube's units when warps < 4.
    for idx in range_stepped(tid, comptime![plan.tiles as usize * 128], CUBE_DIM as usize) {
        let t = idx / 128;
        let o = idx % 128;
        let r = o / 8;
        let cl = (CUBE_POS * comptime![plan.tiles as usize] + t) * 8 + o % 8;
        let mut total = Acc::from_int(0);
        #[unroll]
        for w in 0..warps {
            total += red[(t * warps + w) * 128 + o];
        }
        if r < m && cl < n {
            let t = f32::cast_from(total);
            out[r * n + cl] = if comptime![plan.fused] {
                epilogue_scaled::<F>(t * scales[r], r, cl, n, sb, bias, residual, plan.epi)
            } else {
                epilogue::<F>(t, r, cl, n, sa, sb, bias, residual, plan.epi)
            };
        }
    }
}

// -------------------------------------------------------------------------------------------
// Launch
// -------------------------------------------------------------------------------------------

/// How the skinny kernel splits the work: `warps` per 8-column tile (splitting K) and `tiles`
/// per cube (256 threads, 512 with 16 warps). Enough warps overall to cover the memory latency (about 32 per SM),
/// and no K split where the tiles alone provide them (the 1.5B model's lm_head has 18992).
#[derive(Clone, Copy, Debug)]
struct SkinnyShape {
    warps: u32,
    tiles: u32,
}

impl SkinnyShape {
    fn new<R: Runtime>(client: &ComputeClient<R>, n: usize) -> Self {
        let tiles = n.div_ceil(8).max(1);
        let want = 32 * caps::num_sms(client).max(1) as usize;
        let warps = want.div_ceil(tiles).next_power_of_two().clamp(1, 16) as u32;
        Self {
            warps,
            tiles: (8 / warps).max(1),
        }
    }

    fn cubes(&self, n: usize) -> usize {
        n.div_ceil(8).div_ceil(self.tiles as usize)
    }
}

impl<R: Runtime> Gemm8<'_, R> {
    /// A padded byte matrix as 16-byte vectors (every row pitch is a multiple of 16).
    fn vec_arg(&self, t: &DeviceTensor<R>) -> BufferArg<R> {
        unsafe {
            BufferArg::from_raw_parts(t.handle().clone(), t.handle().size_in_used() as usize / 4)
        }
    }

    fn epilogue_plan(&self) -> EpiloguePlan {
        EpiloguePlan {
            fp8: self.fp8,
            sa_scalar: self.sa_scalar,
            sb_scalar: self.sb_scalar,
            has_bias: self.bias.is_some(),
            has_residual: self.residual.is_some(),
        }
    }

    /// The output and accumulator dtypes.
    fn dtypes(&self) -> [ElemType; 2] {
        let acc = if self.fp8 { DType::F32 } else { DType::I32 };
        [self.out.dtype().elem_type(), acc.elem_type()]
    }

    /// Whether [`Self::launch_fused`] is worth it for an activation of `rows` x `k` and `n`
    /// output columns on this runtime: the codes fit in shared memory, and the redundant
    /// quantization (every cube redoes it) stays below ~2M element encodes; past that (e.g. the
    /// 1.5B model's gate_up and lm_head at M = 1, measured on an H100) the pre-pass is faster.
    pub(crate) fn can_fuse(
        client: &ComputeClient<R>,
        fp8: bool,
        rows: usize,
        k: usize,
        n: usize,
    ) -> bool {
        let cubes = SkinnyShape::new(client, n).cubes(n);
        has_mma8(client, fp8)
            && rows <= SKINNY_MAX_M
            && rows * crate::format::row_pitch(k) <= FUSED_MAX_CODE_BYTES
            && cubes * rows * k <= 2 << 20
    }

    /// The skinny kernel quantizing the float activation `x` (`[M, K]`, contiguous) itself; `a`
    /// and `sa` are not read. Only where [`Self::can_fuse`] holds.
    pub(crate) fn launch_fused(&self, client: &ComputeClient<R>, x: &DeviceTensor<R>) {
        debug_assert!(Self::can_fuse(client, self.fp8, self.m, self.k, self.n));
        self.launch_skinny(client, Some(x));
    }

    /// The skinny tensor-core kernel (M <= 16), reading codes from `a` or, fused, quantizing `x`.
    fn launch_skinny(&self, client: &ComputeClient<R>, x: Option<&DeviceTensor<R>>) {
        let shape = SkinnyShape::new(client, self.n);
        let (warps, tiles) = (shape.warps, shape.tiles);
        let format = if self.fp8 {
            QuantFormat::Fp8E4M3
        } else {
            QuantFormat::Int8
        };
        // Unfused, `x` is never read: bind the output (CUDA only, where aliasing is allowed).
        let xt = x.unwrap_or(self.out);
        let plan = SkinnyPlan {
            epi: self.epilogue_plan(),
            warps,
            tiles,
            fused: x.is_some(),
            rows: RowQuantPlan::new(client, xt, format, 32 * warps * tiles),
        };
        let bias = self.bias.unwrap_or(self.sa);
        let residual = self.residual.unwrap_or(self.sa);
        unsafe {
            gemm8_skinny_kernel::launch_unchecked::<R>(
                client,
                ops::launch::cube_count_1d(client, shape.cubes(self.n) as u32),
                CubeDim::new_1d(32 * warps * tiles),
                plan.rows.vector,
                self.vec_arg(self.a),
                xt.as_buffer_arg(),
                self.vec_arg(self.b),
                self.sa.as_buffer_arg(),
                self.sb.as_buffer_arg(),
                bias.as_buffer_arg(),
                residual.as_buffer_arg(),
                self.out.as_buffer_arg(),
                self.m,
                self.n,
                self.k,
                self.a_pitch / 16,
                self.b_pitch / 16,
                plan,
                self.dtypes(),
            );
        }
    }

    /// Launches on validated operands.
    pub(crate) fn launch(&self, client: &ComputeClient<R>, choice: KernelChoice) {
        let plan = self.epilogue_plan();
        let dtypes = self.dtypes();
        // Without a bias the kernel never reads it, but something must be bound: an input (the
        // row scales), never the output, which WebGPU forbids to alias another binding.
        let bias = self.bias.unwrap_or(self.sa);
        let residual = self.residual.unwrap_or(self.sa);
        let tc = choice == KernelChoice::Auto && has_mma8(client, self.fp8);
        unsafe {
            if tc && self.m <= SKINNY_MAX_M {
                self.launch_skinny(client, None);
            } else if tc {
                gemm8_mma_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(
                        self.n.div_ceil(T_BN) as u32,
                        self.m.div_ceil(T_BM) as u32,
                        1,
                    ),
                    CubeDim::new_1d(128),
                    self.vec_arg(self.a),
                    self.vec_arg(self.b),
                    self.sa.as_buffer_arg(),
                    self.sb.as_buffer_arg(),
                    bias.as_buffer_arg(),
                    residual.as_buffer_arg(),
                    self.out.as_buffer_arg(),
                    self.m,
                    self.n,
                    self.k,
                    self.a_pitch / 16,
                    self.b_pitch / 16,
                    plan,
                    dtypes,
                );
            } else {
                gemm8_simt_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(
                        self.n.div_ceil(S_TILE) as u32,
                        self.m.div_ceil(S_TILE) as u32,
                        1,
                    ),
                    CubeDim::new_2d(16, 16),
                    words_arg(self.a),
                    words_arg(self.b),
                    self.sa.as_buffer_arg(),
                    self.sb.as_buffer_arg(),
                    bias.as_buffer_arg(),
                    residual.as_buffer_arg(),
                    self.out.as_buffer_arg(),
                    self.m,
                    self.n,
                    self.k,
                    self.a_pitch / 4,
                    self.b_pitch / 4,
                    plan,
                    dtypes,
                );
            }
        }
    }
}
