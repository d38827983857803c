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
//!     filled with 16-byte loads, conflict-free fragment reads (row stride of 12 words); K
//!     split over several cubes per tile where the tiles are too few to fill the GPU, the
//!     slices summed in a fixed order by a second launch.
//!   - M <= 16 (decode): m16n8 output tiles, K split over up to 16 warps per tile where the
//!     tiles are few, weights loaded straight from global memory into fragments (the first
//!     batch before the kernel waits for its predecessor), the activation codes staged in shared
//!     memory once per cube (quantized there, or copied from a pre-pass), the K slices summed
//!     at the end (`skinny.rs`).
//! - **Portable (every runtime, wgpu included)**: a shared-memory tiled SIMT kernel over 32-bit
//!   words (64x64 tile, 4x4 outputs per unit), decoding bytes with integer ops; i32 accumulation
//!   for int8 (exact), f32 for fp8 (every e4m3 product is exact in f32).
//!
//! Bytes of a row past K are masked in the loaders, so the padding's content never matters.
//!
//! Files: `epilogue.rs` (the launch argument every kernel shares, `Gemm8Out`, and the
//! dequantizing epilogue that writes it), `words.rs` (masked loads of 8-bit codes as 32-bit
//! words), `mma.rs` (the inline-PTX MMA), one file per kernel with its launch (`portable.rs`,
//! `tiled.rs`, `skinny.rs`), and here the validated operands and the dispatch.

mod epilogue;
pub(crate) mod float_x;
pub(crate) mod float_x_simt;
mod mma;
mod portable;
mod skinny;
mod tiled;
mod words;

use cubecl::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind, IntKind};
use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor};

use epilogue::{EpiloguePlan, Gemm8OutLaunch};
pub(crate) use skinny::XSource;
use skinny::SKINNY_MAX_M;
pub(crate) use tiled::splits_for;

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
    /// As [`Self::Auto`], except at decode sizes (M <= 16) where the float activation is
    /// bf16 or f16 on CUDA with the f16 `mma` (sm_89+ for e4m3 weights) and fits the kernel's
    /// shared memory: there the 8-bit weights multiply x itself on f16 tensor cores, without
    /// quantizing it (no pre-pass, no quantize pass in the product; x rounded to f16 instead
    /// of to 8 bits per row, so the results differ from [`Self::Auto`]'s in the last bits).
    /// Not used by a layer whose workspace asks for row invariance (the kernel's launch shape
    /// changes with M).
    FloatActivations,
    /// As [`Self::Auto`], except at decode sizes (M <= 16, K a multiple of 16) on every runtime:
    /// there the 8-bit weights, decoded to f32 in registers, multiply the float activation in
    /// f32 on the SIMT cores, as the dense GEMV multiplies bf16 weights (no quantize pass, no
    /// pre-pass, x not rounded at all: the results differ from [`Self::Auto`]'s and
    /// [`Self::FloatActivations`]' in the last bits). Not used by a layer whose workspace asks
    /// for row invariance.
    FloatActivationsSimt,
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
    /// Gated MLP: `b`'s `N` rows are the gate rows then the up rows and `out` is
    /// `[M, N/2]` (the skinny kernel only: see [`Gemm8::can_gate`]).
    pub gate: Option<ops::matmul::Activation>,
    /// An RMSNorm of the float activation, applied by the skinny kernel before it quantizes
    /// (only when it quantizes x itself, [`skinny::XSource::Quantize`]).
    pub norm: Option<ops::matmul::InputNorm<'a, R>>,
    /// The tile kernel may allocate the scratch of a K split (never where the caller promises
    /// an allocation-free call: a layer run with a workspace, `w8a8_linear_into`).
    pub may_allocate: bool,
}

impl<R: Runtime> Gemm8<'_, R> {
    /// Whether a gated product (`act(x·Gᵀ) * (x·Uᵀ)` in the epilogue) runs in one launch: the
    /// skinny tensor-core kernel (M <= 16 on a runtime with the 8-bit `mma`).
    pub(crate) fn can_gate(client: &ComputeClient<R>, fp8: bool, rows: usize) -> bool {
        has_mma8(client, fp8) && rows <= SKINNY_MAX_M
    }
}

/// Whether `choice` ([`KernelChoice::FloatActivations`] or
/// [`KernelChoice::FloatActivationsSimt`]) runs its own kernel here for `rows` rows of a `dtype`
/// activation over `k` features against `format` weights (per-channel scales, a layer whose
/// workspace does not ask for row invariance); where it does not, that choice runs as
/// [`KernelChoice::Auto`] (and the other choices always do).
pub fn runs_float_activations<R: Runtime>(
    client: &ComputeClient<R>,
    choice: KernelChoice,
    format: crate::QuantFormat,
    dtype: DType,
    rows: usize,
    k: usize,
) -> bool {
    let fp8 = format == crate::QuantFormat::Fp8E4M3;
    match choice {
        KernelChoice::FloatActivations => float_x::can_run(client, dtype, fp8, rows, k),
        KernelChoice::FloatActivationsSimt => float_x_simt::can_run(rows, k),
        KernelChoice::Auto | KernelChoice::Portable => false,
    }
}

/// Whether the runtime runs warp-level `mma.sync.m16n8k32` for this operand type.
pub fn has_mma8<R: Runtime>(client: &ComputeClient<R>, fp8: bool) -> bool {
    let (t, cd) = if fp8 {
        (
            ElemType::Float(FloatKind::E4M3),
            ElemType::Float(FloatKind::F32),
        )
    } else {
        (ElemType::Int(IntKind::I8), ElemType::Int(IntKind::I32))
    };
    has_warp_mma(client, t, cd, 32)
}

/// Whether the runtime is CUDA with 32-lane planes and runs the warp-level `mma.sync.m16n8k{k}`
/// on operands `ab` with accumulators `cd` (the instruction the kernels issue as inline PTX).
pub(crate) fn has_warp_mma<R: Runtime>(
    client: &ComputeClient<R>,
    ab: ElemType,
    cd: ElemType,
    k: u32,
) -> bool {
    let hw = &client.properties().hardware;
    caps::runtime_name(client).contains("cuda")
        && hw.plane_size_min == 32
        && hw.plane_size_max == 32
        && client.features().matmul.mma.contains(&MmaConfig {
            a_type: ab,
            b_type: ab,
            cd_type: cd,
            m: 16,
            n: 8,
            k,
        })
}

impl<R: Runtime> Gemm8<'_, R> {
    /// A padded byte matrix as 16-byte vectors (every row pitch is a multiple of 16).
    fn vec_arg(&self, t: &DeviceTensor<R>) -> BufferArg<R> {
        // SAFETY: the operands were checked as padded byte matrices.
        unsafe { crate::layout::words_arg(t) }
    }

    fn epilogue_plan(&self) -> EpiloguePlan {
        EpiloguePlan {
            fp8: self.fp8,
            sa_scalar: self.sa_scalar,
            sb_scalar: self.sb_scalar,
            has_bias: self.bias.is_some(),
            has_residual: self.residual.is_some(),
            gate: self.gate,
        }
    }

    /// The output and accumulator dtypes.
    fn dtypes(&self) -> [ElemType; 2] {
        let acc = if self.fp8 { DType::F32 } else { DType::I32 };
        [self.out.dtype().elem_type(), acc.elem_type()]
    }

    /// The kernels' [`epilogue::Gemm8Out`] argument. Without a bias or a residual the kernel never reads
    /// it, but something must be bound: an input (the row scales), never the output, which
    /// WebGPU forbids to alias another binding.
    fn out_arg<F: Float>(&self) -> Gemm8OutLaunch<F, R> {
        let bias = self.bias.unwrap_or(self.sa);
        let residual = self.residual.unwrap_or(self.sa);
        // SAFETY: the operands were validated against M, N and K, which the kernels stay within.
        unsafe {
            Gemm8OutLaunch::new(
                self.sa.as_buffer_arg(),
                self.sb.as_buffer_arg(),
                bias.as_buffer_arg(),
                residual.as_buffer_arg(),
                self.out.as_buffer_arg(),
                self.m,
                self.n,
                self.k,
            )
        }
    }

    /// Launches on validated operands.
    pub(crate) fn launch(&self, client: &ComputeClient<R>, choice: KernelChoice) {
        debug_assert!(self.gate.is_none() || Self::can_gate(client, self.fp8, self.m));
        let tc = choice != KernelChoice::Portable && has_mma8(client, self.fp8);
        if tc && self.m <= SKINNY_MAX_M {
            self.launch_skinny(client, None);
        } else if tc {
            self.launch_tiled(client);
        } else {
            self.launch_portable(client);
        }
    }
}
