//! The tensor-core kernel for M > 16 (CUDA): block tile 128x128x32 bytes, 4 warps of 64x64,
//! double-buffered shared memory filled with 16-byte loads, conflict-free fragment reads (row
//! stride of 12 words).
//!
//! Where the output tiles are too few to fill the GPU (a 512-token prefill's 1536-wide
//! projections have 48, on 132 SMs that each hold two cubes), K is split over up to
//! [`MAX_SPLITS`] cubes per tile: each writes its raw accumulators (i32 for int8, f32 for e4m3)
//! to a scratch slice, and a second launch sums the slices in slice order and applies the
//! dequantizing epilogue, so the result does not depend on which cube finished first (int8's
//! integer sums are exact in any order; e4m3's f32 sums are taken in one fixed order).

use cubecl::prelude::*;

use super::epilogue::{write_output, EpiloguePlan, Gemm8Out};
use super::mma::mma_m16n8k32;
use super::words::load_vec;
use super::Gemm8;
use ops::{DType, DeviceTensor};

const T_BM: usize = 128;
const T_BN: usize = 128;
const T_STRIDE: usize = 12; // words per shared row: 8 + 4 of padding (conflict-free fragments)
const T_STAGE: usize = T_BM * T_STRIDE;
/// Most cubes per output tile along K.
const MAX_SPLITS: usize = 8;
/// Fewest 32-byte K steps a split takes (shorter slices would spend their time in the prologue).
const MIN_STEPS_PER_SPLIT: usize = 8;
/// Cubes of the tile kernel an SM holds at once (128 units, about 25 KB of shared memory and
/// under 256 registers each).
const CUBES_PER_SM: usize = 2;

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
    partials: &mut [Acc],
    steps_per_split: usize,
    a_pv: usize,
    b_pv: usize,
    #[comptime] plan: EpiloguePlan,
    #[comptime] split: bool,
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

    // This cube's 32-byte K steps: all of K, or slice `CUBE_POS_Z` of a split.
    let mut first = 0usize;
    let mut k_tiles = k.div_ceil(32);
    if comptime![split] {
        first = CUBE_POS_Z as usize * steps_per_split;
        k_tiles = min(k_tiles, first + steps_per_split);
    }
    load_tile(a, m0, m, first * 32, k, a_pv, tid, &mut regs, 0usize);
    load_tile(b, n0, n, first * 32, k, b_pv, tid, &mut regs, 2usize);
    store_tile(&mut a_s, tid, &regs, 0usize, 0usize);
    store_tile(&mut b_s, tid, &regs, 0usize, 2usize);
    sync_cube();

    for kt in first..k_tiles {
        let cur = ((kt - first) % 2) * T_STAGE;
        let nxt = ((kt - first + 1) % 2) * T_STAGE;
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
                        if comptime![split] {
                            let at = (CUBE_POS_Z as usize * m + row) * n + col + e;
                            partials[at] = c.extract(2 * h + e);
                        } else {
                            let acc = f32::cast_from(c.extract(2 * h + e));
                            write_output::<F>(&mut io, acc, row, col + e, plan);
                        }
                    }
                }
            }
        }
    }
}

/// The split kernel's second launch: output `(row, col)` is the sum of the `splits` slices'
/// accumulators, in slice order, through the dequantizing epilogue.
#[cube(launch_unchecked)]
fn gemm8_split_sum_kernel<F: Float, Acc: Numeric>(
    partials: &[Acc],
    mut io: Gemm8Out<F>,
    splits: usize,
    #[comptime] plan: EpiloguePlan,
    #[define(F, Acc)] _dtypes: [ElemType; 2],
) {
    let n = io.n;
    let mn = io.m * n;
    let at = ABSOLUTE_POS;
    if at < mn {
        let mut total = partials[at];
        for s in 1..splits {
            total += partials[s * mn + at];
        }
        let (row, col) = (at / n, at % n);
        write_output::<F>(&mut io, f32::cast_from(total), row, col, plan);
    }
}

/// Cubes along K per output tile for `tiles` tiles of `steps` K steps on `sms` SMs: enough to
/// give every SM [`CUBES_PER_SM`] cubes where the tiles alone do not, each slice at least
/// [`MIN_STEPS_PER_SPLIT`] steps long; 1 where the tiles fill the GPU. Shared by the tensor-core
/// tile kernels whose cubes are 4 warps of 64x64 over steps of 32 k (32 bytes of 8-bit codes
/// here, 16 bytes of int4 codes in `crate::w4a16_gemm`): two such cubes fit an SM.
pub(crate) fn splits_for(tiles: usize, steps: usize, sms: usize) -> usize {
    let want = (CUBES_PER_SM * sms / tiles.max(1)).clamp(1, MAX_SPLITS);
    want.min(steps / MIN_STEPS_PER_SPLIT).max(1)
}

impl<R: Runtime> Gemm8<'_, R> {
    /// The tensor-core kernel for M > 16: one 128x128 output tile per cube of 4 warps, K split
    /// over several cubes where the tiles are few ([`splits_for`]) and the caller lets the
    /// product allocate (the slices' accumulators go to a scratch allocated per call).
    pub(super) fn launch_tiled(&self, client: &ComputeClient<R>) {
        let (nx, ny) = (self.n.div_ceil(T_BN), self.m.div_ceil(T_BM));
        let steps = self.k.div_ceil(32);
        let splits = match self.may_allocate {
            true => splits_for(nx * ny, steps, ops::caps::num_sms(client) as usize),
            false => 1,
        };
        let per_split = steps.div_ceil(splits);
        // Slices of `per_split` steps: the last may be shorter, none is empty.
        let splits = steps.div_ceil(per_split);
        let acc = if self.fp8 { DType::F32 } else { DType::I32 };
        let partials = (splits > 1)
            .then(|| DeviceTensor::<R>::empty(client, &[splits * self.m * self.n], acc));
        // Without a split the scratch is never touched: bind the output.
        let scratch = partials.as_ref().unwrap_or(self.out);
        let count = CubeCount::Static(nx as u32, ny as u32, splits as u32);
        // SAFETY: the operands were validated against M, N and K, the scratch holds
        // `splits · M · N` accumulators, and the kernels stay within them.
        unsafe {
            gemm8_mma_kernel::launch_unchecked::<R>(
                client,
                count,
                CubeDim::new_1d(128),
                self.vec_arg(self.a),
                self.vec_arg(self.b),
                self.out_arg(),
                scratch.as_buffer_arg(),
                per_split,
                self.a_pitch / 16,
                self.b_pitch / 16,
                self.epilogue_plan(),
                splits > 1,
                self.dtypes(),
            );
            if let Some(p) = &partials {
                let mn = self.m * self.n;
                gemm8_split_sum_kernel::launch_unchecked::<R>(
                    client,
                    ops::launch::cube_count_1d(client, mn.div_ceil(256) as u32),
                    CubeDim::new_1d(256),
                    p.as_buffer_arg(),
                    self.out_arg(),
                    splits,
                    self.epilogue_plan(),
                    self.dtypes(),
                );
            }
        }
    }
}

#[cfg(test)]
mod cuda_source;

#[cfg(test)]
mod tests {
    use super::splits_for;

    #[test]
    fn splits_fill_the_gpu_only_where_tiles_are_few() {
        // A 512-token prompt's 1536-wide projection on 132 SMs: 48 tiles, 48 steps of K = 1536.
        assert_eq!(splits_for(48, 48, 132), 5);
        // Enough tiles for two cubes per SM: no split.
        assert_eq!(splits_for(264, 48, 132), 1);
        assert_eq!(splits_for(560, 48, 132), 1);
        // At most 8 slices, each of at least 8 steps.
        assert_eq!(splits_for(1, 1000, 132), 8);
        assert_eq!(splits_for(1, 20, 132), 2);
        assert_eq!(splits_for(2, 7, 132), 1);
        assert_eq!(splits_for(0, 64, 132), 8);
    }
}
