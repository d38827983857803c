//! The portable kernel (every runtime, wgpu included): a shared-memory tiled SIMT GEMM over
//! 32-bit words, 64x64 tile, 4x4 outputs per unit, bytes decoded with integer ops.

use cubecl::prelude::*;

use super::epilogue::{write_output, EpiloguePlan, Gemm8Out};
use super::words::mask_word;
use super::Gemm8;
use crate::codec::{decode_e4m3, sext_byte};
use crate::layout::words_arg;

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

const S_TILE: usize = 64;
const S_BKW: usize = 8; // words (32 bytes) of K per stage
const S_STRIDE: usize = S_BKW + 1;

#[cube(launch_unchecked)]
fn gemm8_simt_kernel<F: Float, Acc: Numeric>(
    a: &[i32],
    b: &[i32],
    mut io: Gemm8Out<F>,
    a_pw: usize,
    b_pw: usize,
    #[comptime] plan: EpiloguePlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let m = io.m;
    let n = io.n;
    let k = io.k;
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
                write_output::<F>(&mut io, f32::cast_from(acc[i * 4 + j]), row, col, plan);
            }
        }
    }
}

impl<R: Runtime> Gemm8<'_, R> {
    /// The portable kernel: one 64x64 output tile per cube of 16x16 units.
    pub(super) fn launch_portable(&self, client: &ComputeClient<R>) {
        let count = CubeCount::Static(
            self.n.div_ceil(S_TILE) as u32,
            self.m.div_ceil(S_TILE) as u32,
            1,
        );
        unsafe {
            gemm8_simt_kernel::launch_unchecked::<R>(
                client,
                count,
                CubeDim::new_2d(16, 16),
                words_arg(self.a),
                words_arg(self.b),
                self.out_arg(),
                self.a_pitch / 4,
                self.b_pitch / 4,
                self.epilogue_plan(),
                self.dtypes(),
            );
        }
    }
}
