//! Programmatic dependent launch inside a kernel: the wait for the kernel before this one.
//!
//! A decode GEMV launched early (see [`crate::caps::has_pdl`]) issues its first weight loads,
//! which no kernel writes, and only then runs `griddepcontrol.wait`, so that those loads stream
//! while the kernel before it finishes. The PTX order alone does not hold: ptxas treats the wait
//! as an instruction without operands and may schedule it above loads that come before it in
//! the PTX. In ptxas 12.9's SASS of the 8-bit SIMT gate-up (sm_90a) the wait (`ACQBULK`) was the
//! kernel's first instruction, above even the loads of the launch's scalars, so its weights only
//! started to load once the kernel before it had finished.
//!
//! The other direction matters for correctness: a buffer the kernel only reads is declared
//! `const __restrict__` and loaded with `ld.global.nc`, which ptxas may move above the wait, so a
//! load of the previous kernel's output written after the wait could still read it stale (in
//! ptxas 12.9's SASS of the f32 decode GEMV with its wait pinned by [`wait_after()`], the first
//! vector of x was loaded above the wait). A kernel that places its own wait therefore names the
//! parameters it reads before the wait in the PTX comment `// cubellm.early_params i j ..`
//! (positions in the entry point's parameter list, 0 first: its weights); the patched CUDA
//! runtime drops `__restrict__` from its other `const` pointer parameters, whose loads are then
//! coherent and stay below the wait (`vendor/cubecl-cuda/src/pdl/coherent.rs`).
//! `dev/cuda_compile/check.py --sass` lists the parameters each kernel reads before its wait.

use cubecl::prelude::*;

/// `griddepcontrol.wait` once `dep` is known: `dep` is computed from the loads that must be in
/// flight before the wait (e.g. the XOR of one word of each loaded vector). The wait is split
/// into two complementary predicated waits on a predicate of `dep`, so exactly one of them runs
/// and neither can be scheduled before the loads that produce `dep` return.
///
/// CUDA only (inline PTX); the caller launches it where [`crate::caps::has_pdl`] holds.
#[cube]
pub fn wait_after(dep: u32) {
    // A new immutable value, as inline PTX takes a mutable variable by its address; times an odd
    // number, so zero exactly where `dep` is and not foldable to a constant.
    let operand = dep * 3u32;
    gpu_asm!(
        "{{ .reg .pred p; setp.eq.u32 p, {d}, 0; @p griddepcontrol.wait; @!p griddepcontrol.wait; }}",
        d = in(_) operand,
    );
}

/// `at`, or `last` where `witness` is NaN: an index that ptxas cannot compute before `witness`
/// is known, for a load that must not be issued before the wait.
///
/// A kernel's read-only buffers are `const __restrict__` pointers, loaded with `ld.global.nc`,
/// which ptxas treats as free to move: in ptxas 12.9's SASS of the 8-bit SIMT GEMV it issued
/// the residual's loads, written after `griddepcontrol.wait` in the PTX, above the wait, where
/// they could read the output of a kernel still running. Taking the index from a value computed
/// after the wait (a unit's partial dot product, which reads x) holds the load below it. The
/// witness must be one that makes the loaded value's output NaN where it is NaN (the partial
/// sum of that output's own row and column): there the other index changes nothing.
///
/// Under the patched CUDA runtime a parameter that the kernel does not name in its
/// `cubellm.early_params` comment is no longer `__restrict__`, so its loads are coherent and stay
/// below the wait anyway (see the module docs); the dependency is kept as a second guard, at the
/// cost of one compare and select per load.
#[cube]
pub fn index_after(at: usize, witness: f32, last: usize) -> usize {
    select(witness.is_nan(), last, at)
}
