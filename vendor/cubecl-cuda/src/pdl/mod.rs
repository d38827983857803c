//! cubellm patch: programmatic dependent launch (PDL) for every kernel on sm_90 and newer.
//!
//! A kernel normally starts only once the one before it on the stream has finished and its
//! writes are flushed, so the GPU idles between two kernels for the launch and the ramp-up
//! (about 1.8 µs per kernel on the H100: an f16 add at 4096 x 4096 takes 36.4 µs back to back,
//! 34.6 with PDL, measured in `dev/add_controls/pdl.cu`). With PDL the next kernel is launched
//! while the previous one drains, and holds at `griddepcontrol.wait` until that one has
//! completed and its memory is visible.
//!
//! That is only sound for a kernel that waits before its first global memory access, so the
//! compiler puts the wait first in every entry point ([`with_prologue`]) and a module is launched
//! with the attribute only when its PTX has the wait ([`waits_first`]).
//!
//! The prologue does not trigger the next launch early (`griddepcontrol.launch_dependents`), so
//! the next grid is launched once every block of this one has exited, not while they run. A
//! trigger at the top of every kernel gained another 0.05 µs on the add but cut the 1.5B model's
//! 512-token prefill from 39 300 to 23 400 tok/s on the H100 (without it: 40 100-40 300, against
//! 39 400-39 500 with PDL off). Most likely the next grid's blocks were placed on the SMs, and held
//! their resources there, while the previous grid still ran, so one-wave GEMM and attention grids
//! were spread unevenly.
//!
//! [`set_programmatic_launch`] turns it off (for comparisons); call it before the first kernel is
//! compiled.

use std::ffi::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{DriverError, sys};

mod coherent;
mod entry;
mod launch_bounds;
mod prologue;
pub(crate) use coherent::with_coherent_inputs;
pub(crate) use launch_bounds::with_min_cubes;
pub(crate) use prologue::{waits_first, with_prologue};

static OFF: AtomicBool = AtomicBool::new(false);

/// Turns programmatic dependent launch on (the default) or off for the whole process. Kernels
/// compiled before the call keep the mode they were compiled in.
pub fn set_programmatic_launch(enabled: bool) {
    OFF.store(!enabled, Ordering::Relaxed);
}

/// Whether kernels for this architecture (`sm_XY` as `XY`) get the prologue.
pub(crate) fn enabled(arch_version: u32) -> bool {
    arch_version >= 90 && !OFF.load(Ordering::Relaxed)
}

/// `cuLaunchKernelEx` with programmatic stream serialization allowed.
///
/// # Safety
/// As [`cudarc::driver::result::launch_kernel`]; `func` must wait for its predecessor before
/// any global memory access ([`waits_first`]).
pub(crate) unsafe fn launch(
    func: sys::CUfunction,
    grid: (c_uint, c_uint, c_uint),
    block: (c_uint, c_uint, c_uint),
    shared_mem_bytes: c_uint,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), DriverError> {
    // SAFETY: plain C structs; every field the driver reads is set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: shared_mem_bytes,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: forwarded from the caller; `config` and `attr` outlive the call.
    unsafe {
        sys::cuLaunchKernelEx(&config, func, params.as_mut_ptr(), std::ptr::null_mut()).result()
    }
}
