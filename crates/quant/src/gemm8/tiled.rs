//! The tensor-core kernel for M > 16 (CUDA): block tile 128x128x32 bytes, 4 warps of 64x64,
//! double-buffered shared memory filled with 16-byte loads, conflict-free fragment reads (row
//! stride of 12 words).

use cubecl::prelude::*;

use super::epilogue::{write_output, EpiloguePlan, Gemm8Out};
use super::mma::mma_m16n8k32;
use super::words::load_vec;
use super::Gemm8;

const T_BM: usize = 128;
const T_BN: usize = 128;
const T_STRIDE: usize = 12; // words per shared row: 8 + 4 of padding (conflict-free fragments)
const T_STAGE: usize = T_BM * T_STRIDE;

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
        let row = row0 + idx / 2;
        let byte = k0 + (idx % 2) * 16;
        regs[base + r] = load_vec(src, row, row < rows, byte, k, pitch_vecs);
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
    mut io: Gemm8Out<F>,
    a_pv: usize,
    b_pv: usize,
    #[comptime] plan: EpiloguePlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let m = io.m;
    let n = io.n;
    let k = io.k;
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
                        let acc = f32::cast_from(c.extract(2 * h + e));
                        write_output::<F>(&mut io, acc, row, col + e, plan);
                    }
                }
            }
        }
    }
}

impl<R: Runtime> Gemm8<'_, R> {
    /// The tensor-core kernel for M > 16: one 128x128 output tile per cube of 4 warps.
    pub(super) fn launch_tiled(&self, client: &ComputeClient<R>) {
        let count = CubeCount::Static(
            self.n.div_ceil(T_BN) as u32,
            self.m.div_ceil(T_BM) as u32,
            1,
        );
        unsafe {
            gemm8_mma_kernel::launch_unchecked::<R>(
                client,
                count,
                CubeDim::new_1d(128),
                self.vec_arg(self.a),
                self.vec_arg(self.b),
                self.out_arg(),
                self.a_pitch / 16,
                self.b_pitch / 16,
                self.epilogue_plan(),
                self.dtypes(),
            );
        }
    }
}
