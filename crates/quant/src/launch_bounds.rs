//! Occupancy requests to the compiler, from inside a kernel.

use cubecl::prelude::*;

/// Asks that `n` cubes fit one SM (2 to 6; one always fits): the patched CUDA runtime reads this
/// PTX comment and gives the entry point `__launch_bounds__(units, n)`, so ptxas caps the
/// registers per unit to fit.
#[cube]
pub(crate) fn request_cubes_per_sm(#[comptime] n: u32) {
    if comptime![n == 2] {
        gpu_asm!("// cubellm.min_cubes_per_sm 2");
    } else if comptime![n == 3] {
        gpu_asm!("// cubellm.min_cubes_per_sm 3");
    } else if comptime![n == 4] {
        gpu_asm!("// cubellm.min_cubes_per_sm 4");
    } else if comptime![n == 5] {
        gpu_asm!("// cubellm.min_cubes_per_sm 5");
    } else if comptime![n == 6] {
        gpu_asm!("// cubellm.min_cubes_per_sm 6");
    }
}
