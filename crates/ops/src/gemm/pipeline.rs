//! The two ways a GEMM-like kernel feeds its shared-memory stages while it computes, as drivers
//! over a kernel-supplied state:
//!
//! - [`run_async_pipeline()`]: a ring of `depth` shared buffers filled by `cp.async` (CUDA sm_80+,
//!   `features.copy_async`), one shared mbarrier per buffer with an arrival count of the whole
//!   cube. The copies of step `t + depth - 1` are in flight while step `t` is computed. Every
//!   unit commits its copies to the buffer's barrier (`commit_copy_async`, which is not an
//!   arrival) and later `arrive_and_wait`s on it before reading the buffer; passing that wait
//!   also proves that every unit has finished the previous step (each arrives only after
//!   computing it), so the buffer that step read can be refilled without a `sync_cube`. The
//!   step loop is unrolled by `depth` so that every buffer and barrier index is comptime. The
//!   kernel's [`AsyncStages::issue`] must start copies only (no waiting), zero-filling what
//!   lies outside its operands (see [`crate::gemm::copy_or_zero_async()`]).
//! - [`run_register_double_buffer()`]: two shared buffers; the next step is loaded into
//!   registers while the current buffer is computed, then stored into the other buffer (one
//!   `sync_cube` per step). Works on every runtime.
//!
//! A kernel implements the traits on a `#[derive(CubeType)]` struct holding what its parts need
//! (operand slices, shared buffers, fragments or accumulators, tile origin); the tensor-core
//! GEMM's `CmmaStages` (`ops/src/matmul/cmma/kernel.rs`) is a complete example:
//!
//! ```ignore
//! #[derive(CubeType)]
//! struct Stages<'a, F: Float, N: Size> {
//!     x: &'a [Vector<F, N>],
//!     a_s: Shared<[Vector<F, N>]>,
//!     accs: Sequence<cmma::Matrix<f32>>,
//!     m0: &'a usize,
//!     #[cube(comptime)]
//!     bp: MyBlueprint,
//! }
//!
//! #[cube]
//! impl<'a, F: Float, N: Size> Stages<'a, F, N> {
//!     fn new(x: &'a [Vector<F, N>], m0: &'a usize, #[comptime] bp: MyBlueprint) -> Stages<'a, F, N> {
//!         let a_s = Shared::<[Vector<F, N>]>::new_aligned_slice(/* .. */);
//!         // ..
//!         Stages::<'a, F, N> { x, a_s, accs, m0, bp }
//!     }
//! }
//!
//! #[cube]
//! impl<'a, F: Float, N: Size> AsyncStages for Stages<'a, F, N> {
//!     fn issue(this: &mut Self, stage: usize, step: usize) { /* cp.async of step into stage */ }
//!     fn compute(this: &mut Self, stage: usize, step: usize) { /* mma on stage */ }
//! }
//!
//! // In the kernel:
//! let mut stages = Stages::new(x, &m0, bp);
//! run_async_pipeline::<Stages<'_, F, N>>(&mut stages, steps, depth);
//! // .. then the epilogue reads stages.accs
//! ```
//!
//! Three things the 0.11 frontend needs: the struct is built in a `#[cube] impl` with a named
//! lifetime (a kernel cannot name one, so a struct literal with references cannot be written in
//! the kernel); runtime scalars are held by reference (`&'a usize`), since a scalar field is
//! stored as a mutable copy, a local variable per field (arrays, shared memory, sequences and
//! fragments are moved in without a copy); the driver is called with its type parameters
//! spelled out.
//!
//! The drivers are expanded inline (like every `#[cube]` function), so a kernel gets the same
//! code as if it had written the loop itself.

use cubecl::prelude::barrier::Barrier;
use cubecl::prelude::*;

/// A kernel's part in [`run_async_pipeline()`].
#[cube]
pub trait AsyncStages: CubeType {
    /// Starts (without waiting) this unit's `cp.async` copies of K step `step` into shared
    /// buffer `stage` (`0..depth`, a constant at every call).
    fn issue(this: &mut Self, stage: usize, step: usize);

    /// Computes on shared buffer `stage`, which holds K step `step`.
    fn compute(this: &mut Self, stage: usize, step: usize);
}

/// Runs `steps` K steps through a `cp.async` ring of `depth` (>= 2) shared buffers: a prologue
/// issuing steps `0..depth - 1`, then per step `t`: wait on buffer `t % depth`, issue step
/// `t + depth - 1` into the buffer step `t - 1` read, commit it, compute step `t`. Every unit
/// of the cube must call this (the barriers count the whole cube). CUDA only (sm_80+).
#[cube]
pub fn run_async_pipeline<S: AsyncStages>(stages: &mut S, steps: usize, #[comptime] depth: usize) {
    let mut bars = Sequence::<Shared<Barrier>>::new();
    #[unroll]
    for _ in 0..depth {
        bars.push(Barrier::shared(CUBE_DIM, UNIT_POS == 0));
    }
    // Prologue: steps 0 .. depth - 1 in flight (a barrier with nothing issued still gets its
    // commit, so that every buffer's phase advances the same way).
    #[unroll]
    for s in 0..depth - 1 {
        if s < steps {
            S::issue(stages, s, s);
        }
        bars.index(s).commit_copy_async();
    }
    // Step t reads buffer t % depth; unrolled by `depth` so that every barrier index is
    // comptime.
    for t0 in range_stepped(0, steps, depth) {
        #[unroll]
        for s in 0..depth {
            let t = t0 + s;
            if t < steps {
                bars.index(s).arrive_and_wait();
                // Every unit is past step t - 1 (it arrived above only after computing it), so
                // the buffer that step read is free for step t + depth - 1.
                let next = comptime![(s + depth - 1) % depth];
                let nt = t + depth - 1;
                if nt < steps {
                    S::issue(stages, next, nt);
                }
                bars.index(next).commit_copy_async();
                S::compute(stages, s, t);
            }
        }
    }
}

/// A kernel's part in [`run_register_double_buffer()`]; `T` is the register type of one staged
/// element (e.g. a vector of the operands' dtype).
#[cube]
pub trait RegisterStages<T: CubePrimitive>: CubeType {
    /// Loads this unit's share of K step `step` from global memory into `regs` (zero outside
    /// the operands).
    fn load(this: &mut Self, regs: &mut Array<T>, step: usize);

    /// Writes `regs` into shared buffer `buf` (0 or 1).
    fn store(this: &mut Self, regs: &Array<T>, buf: usize);

    /// Computes on shared buffer `buf`, which holds K step `step`.
    fn compute(this: &mut Self, buf: usize, step: usize);
}

/// Runs `steps` (>= 1) K steps through two shared buffers, the next step waiting in `regs`
/// while the current one is computed: load 0, store 0, then per step: load the next step,
/// compute this one, store the next into the other buffer, `sync_cube`. Every unit of the cube
/// must call this.
#[cube]
pub fn run_register_double_buffer<T: CubePrimitive, S: RegisterStages<T>>(
    stages: &mut S,
    regs: &mut Array<T>,
    steps: usize,
) {
    S::load(stages, regs, 0);
    S::store(stages, &*regs, 0);
    sync_cube();
    for step in 0..steps {
        let buf = step % 2;
        let has_next = step + 1 < steps;
        if has_next {
            S::load(stages, regs, step + 1);
        }
        S::compute(stages, buf, step);
        if has_next {
            S::store(stages, &*regs, 1 - buf);
        }
        sync_cube();
    }
}
