//! CUDA C++ of a kernel without a GPU: CubeCL's expansion and its CUDA backend need no device,
//! so a test expands a CUDA-only kernel with whichever runtime is at hand, for a plan made as an
//! sm_90 device would make it, and compiles the definition here. `.ci/run` then compiles the
//! written sources with NVRTC and ptxas (`dev/cuda_compile/`).

use cubecl::prelude::*;
use cubecl::Compiler;

// The patched CUDA runtime's source rewrites (std only), applied as it applies them.
#[path = "../../../vendor/cubecl-cuda/src/pdl/coherent.rs"]
#[allow(dead_code)]
mod coherent;
#[path = "../../../vendor/cubecl-cuda/src/pdl/entry.rs"]
mod entry;
#[path = "../../../vendor/cubecl-cuda/src/pdl/launch_bounds.rs"]
#[allow(dead_code)]
mod launch_bounds;
#[path = "../../../vendor/cubecl-cuda/src/pdl/prologue.rs"]
#[allow(dead_code)]
mod prologue;

/// The settings and launcher of a 1-D launch of `units` units, as the launch macros make them
/// (unchecked, 32-bit addresses), the launcher's scope given `client`'s device properties.
pub fn launcher<R: Runtime>(
    client: &ComputeClient<R>,
    units: u32,
) -> (KernelSettings, KernelLauncher<R>) {
    launcher_of(client, CubeDim::new_1d(units))
}

/// [`launcher`] for a cube of any shape.
pub fn launcher_of<R: Runtime>(
    client: &ComputeClient<R>,
    cube_dim: CubeDim,
) -> (KernelSettings, KernelLauncher<R>) {
    let settings = KernelSettings::new(cube_dim.into(), ExecutionMode::Unchecked, AddressType::U32);
    let mut launcher = KernelLauncher::<R>::new(settings.clone());
    launcher.with_scope(|scope| scope.device_properties(client.properties()));
    (settings, launcher)
}

/// The cube reduction of an sm_90 device (plane operations, 32-lane planes) for `cube_dim`
/// units.
pub fn sm90_reduce(cube_dim: u32) -> ops::reduce::ReducePlan {
    ops::reduce::ReducePlan {
        cube_dim,
        use_plane: true,
        plane_size_min: 32,
        plane_size_fixed: true,
    }
}

/// Runs `case::<R>(&client)` on the first runtime present: a kernel's CUDA source does not
/// depend on the runtime that expands it.
#[macro_export]
macro_rules! on_first_runtime {
    ($case:ident) => {{
        let backend = $crate::backends()[0];
        $crate::runtime::with_runtime!(backend, |client: R| $case::<R>(&client));
    }};
}

/// A small buffer argument: registering a buffer only gives an argument its kind.
pub fn buffer<R: Runtime>(client: &ComputeClient<R>) -> BufferArg<R> {
    // SAFETY: the argument is registered to define a kernel, never bound to a launch.
    unsafe { BufferArg::from_raw_parts(client.empty(256), 16) }
}

/// The CUDA C++ of `definition` (a kernel's `define()`), as the CUDA runtime would compile it.
/// Panics, naming `name`, where the backend refuses the kernel or where an inline-asm `mma`
/// takes an operand by address (an asm output used straight as another asm's input stays a
/// mutable variable, which the backend passes as a pointer and ptxas refuses). With
/// `CUBELLM_CUDA_SOURCE_DIR` set, writes the source there as `<name>.cu`.
///
/// The source is rewritten as the patched CUDA runtime rewrites it for sm_90 (the programmatic
/// dependent launch prologue, coherent loads of the inputs a kernel that waits itself does not
/// read before its wait, a kernel's cubes-per-SM request as launch bounds).
pub fn check(name: &str, definition: KernelDefinition) -> String {
    let entry = definition.settings.kernel_name.clone();
    // The features the CUDA runtime turns on for an sm_90 device with CUDA 12.8 or newer: the
    // launch's scalars then travel in the parameter block (`__grid_constant__`), not in a
    // global buffer that each kernel would load first.
    let mut options = <cubecl::cuda::CudaCompiler as Compiler>::CompilationOptions::default();
    let features = &mut options.supports_features;
    features.grid_constants = true;
    features.clusters = true;
    features.elect_sync = true;
    features.fast_tanh = true;
    let mut source = cubecl::cuda::CudaCompiler::default()
        .compile(definition, &options)
        .unwrap_or_else(|e| panic!("{name}: the CUDA backend refused the kernel: {e}"))
        .to_string();
    if let Some(s) = coherent::with_coherent_inputs(&source, &entry) {
        source = s;
    }
    if let Some(s) = prologue::with_prologue(&source, &entry) {
        source = s;
    }
    if let Some(s) = launch_bounds::with_min_cubes(&source, &entry) {
        source = s;
    }
    let mmas: Vec<&str> = source.lines().filter(|l| l.contains("mma.sync")).collect();
    if let Some(l) = mmas.iter().find(|l| l.contains("\"l\"(")) {
        panic!("{name}: an mma operand passed by address: {l}");
    }
    if let Some(dir) = std::env::var_os("CUBELLM_CUDA_SOURCE_DIR") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("CUBELLM_CUDA_SOURCE_DIR");
        std::fs::write(dir.join(format!("{name}.cu")), &source).expect("write the CUDA source");
    }
    source
}
