//! The 8-bit GEMM shared by W8A8 (int8 × int8 → i32) and FP8 (e4m3 × e4m3 → f32):
//! `out[m, n] = acc[m, n] · sa[m] · sb[n] (+ bias[n])` with `acc = Σ_k A[m, k] · B[n, k]`,
//! both operands padded 8-bit matrices with K contiguous ("NT", see [`crate::layout`]).
//!
//! Two kernels:
//! - **Tensor cores (CUDA, sm_80+ for int8, sm_89+ for e4m3), opt-in and not yet verified on
//!   hardware** ([`KernelChoice::TensorCore`]): warp-level
//!   `mma.sync.m16n8k32` (`.s32.s8.s8.s32` / `.f32.e4m3.e4m3.f32`). CubeCL 0.11.0-pre.3 reports
//!   these shapes in `features.matmul.mma` and accepts i8 in `cmma` (wmma) too, but its manual-MMA
//!   lowering tags every fp8 MMA `.kind::f8f6f4`, a qualifier that only exists on sm_120a; so the
//!   instruction is issued with `gpu_asm!` in the sm_89 form, and int8 goes the same way for
//!   symmetry. Operands stay 32-bit words end to end (4 codes per register, the PTX fragment
//!   layout), so no 8-bit CubeCL type is ever materialised. Block tile 128×128×32 bytes, 4 warps
//!   of 64×64, double-buffered shared memory filled with 16-byte loads, conflict-free fragment
//!   reads (row stride of 12 words).
//! - **Portable (every runtime, wgpu included)**: a shared-memory tiled SIMT kernel over 32-bit
//!   words (64×64 tile, 4×4 outputs per unit), decoding bytes with integer ops; i32 accumulation
//!   for int8 (exact), f32 for fp8 (every e4m3 product is exact in f32).
//!
//! Bytes of a row past K are masked in the loaders, so the padding's content never matters.

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind, IntKind};
use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

use crate::codec::{decode_e4m3, sext_byte};
use crate::layout::words_arg;

/// Which kernel runs the 8-bit GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KernelChoice {
    /// The portable kernel, on every runtime (CUDA included). The default: it is the one that
    /// has been checked against the references.
    #[default]
    Portable,
    /// The `mma.sync` tensor-core kernel where the runtime has the instruction (see
    /// [`has_mma8`]), the portable one elsewhere. NOT YET VERIFIED ON HARDWARE: it compiles,
    /// but no session has had a GPU to test it since it was written, so nothing selects it by
    /// default.
    TensorCore,
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

/// The dequantizing epilogue for one output element.
#[cube]
pub(crate) fn epilogue<F: Float>(
    acc: f32,
    row: usize,
    col: usize,
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    #[comptime] plan: EpiloguePlan,
) -> F {
    let a = if comptime![plan.sa_scalar] {
        sa[0]
    } else {
        sa[row]
    };
    let b = if comptime![plan.sb_scalar] {
        sb[0]
    } else {
        sb[col]
    };
    let mut y = acc * a * b;
    if comptime![plan.has_bias] {
        y += f32::cast_from(bias[col]);
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
                out[row * n + col] =
                    epilogue::<F>(f32::cast_from(acc[i * 4 + j]), row, col, sa, sb, bias, plan);
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

/// One warp-level `mma.sync.m16n8k32` on 8-bit codes packed four per register.
#[cube]
pub(crate) fn mma_m16n8k32<Acc: Numeric>(
    a: Vector<i32, Const<4>>,
    b: Vector<i32, Const<2>>,
    c: Vector<Acc, Const<4>>,
    #[comptime] fp8: bool,
) -> Vector<Acc, Const<4>> {
    let d: Vector<Acc, Const<4>>;
    if comptime![fp8] {
        gpu_asm!(
            "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {d}, {a}, {b}, {c};",
            a = in(_) a,
            b = in(_) b,
            c = in(_) c,
            d = out(_) d,
            options(nomem),
        );
    } else {
        gpu_asm!(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {d}, {a}, {b}, {c};",
            a = in(_) a,
            b = in(_) b,
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
        let mut af = Array::<Vector<i32, Const<4>>>::new(4usize);
        #[unroll]
        for mi in 0..4usize {
            let r = cur + (wm * 64 + mi * 16 + gid) * T_STRIDE + tig;
            let mut v = Vector::<i32, Const<4>>::new(0i32);
            v.insert(0usize, a_s[r]);
            v.insert(1usize, a_s[r + 8 * T_STRIDE]);
            v.insert(2usize, a_s[r + 4]);
            v.insert(3usize, a_s[r + 8 * T_STRIDE + 4]);
            af[mi] = v;
        }
        #[unroll]
        for ni in 0..8usize {
            let r = cur + (wn * 64 + ni * 8 + gid) * T_STRIDE + tig;
            let mut bf = Vector::<i32, Const<2>>::new(0i32);
            bf.insert(0usize, b_s[r]);
            bf.insert(1usize, b_s[r + 4]);
            #[unroll]
            for mi in 0..4usize {
                acc[mi * 8 + ni] = mma_m16n8k32::<Acc>(af[mi], bf, acc[mi * 8 + ni], plan.fp8);
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
                            sa,
                            sb,
                            bias,
                            plan,
                        );
                    }
                }
            }
        }
    }
}

// -------------------------------------------------------------------------------------------
// Launch
// -------------------------------------------------------------------------------------------

impl<R: Runtime> Gemm8<'_, R> {
    /// Launches on validated operands.
    pub(crate) fn launch(&self, client: &ComputeClient<R>, choice: KernelChoice) {
        let plan = EpiloguePlan {
            fp8: self.fp8,
            sa_scalar: self.sa_scalar,
            sb_scalar: self.sb_scalar,
            has_bias: self.bias.is_some(),
        };
        let acc = if self.fp8 { DType::F32 } else { DType::I32 };
        let dtypes = [self.out.dtype().elem_type(), acc.elem_type()];
        // Without a bias the kernel never reads it, but something must be bound: an input (the
        // row scales), never the output, which WebGPU forbids to alias another binding.
        let bias = self.bias.unwrap_or(self.sa);
        let tc = choice == KernelChoice::TensorCore && has_mma8(client, self.fp8);
        unsafe {
            if tc {
                let a = BufferArg::from_raw_parts(
                    self.a.handle().clone(),
                    self.a.handle().size_in_used() as usize / 4,
                );
                let b = BufferArg::from_raw_parts(
                    self.b.handle().clone(),
                    self.b.handle().size_in_used() as usize / 4,
                );
                gemm8_mma_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(
                        self.n.div_ceil(T_BN) as u32,
                        self.m.div_ceil(T_BM) as u32,
                        1,
                    ),
                    CubeDim::new_1d(128),
                    a,
                    b,
                    self.sa.as_buffer_arg(),
                    self.sb.as_buffer_arg(),
                    bias.as_buffer_arg(),
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
