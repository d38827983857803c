//! The kernel's CUDA C++ as the CUDA runtime compiles it, built on any machine: CubeCL's
//! expansion and its C++ backend need no device, so a launch's plan for an sm_90 device (132
//! SMs, programmatic dependent launch, plane reductions) is expanded with whichever runtime is
//! at hand and compiled by `cubecl::cuda::CudaCompiler`. Each of the 1.5B model's four
//! projections in both formats, and a 12-row gated one (two MMAs of x rows), must compile, and
//! no `mma` may take an operand by address (an asm output fed straight into another asm stays
//! a mutable variable, which the backend passes as a pointer: ptxas refuses it).
//!
//! With `CUBELLM_CUDA_SOURCE_DIR` set, each source is written there as `float_x_<case>.cu`, for
//! `dev/cuda_compile/check.py` to compile with NVRTC and ptxas as the device would (`.ci/run`
//! does).

use cubecl::prelude::*;
use cubecl::Compiler;
use ops::gemm::EpilogueBlueprint;
use ops::matmul::Activation;
use ops::reduce::ReducePlan;
use ops::DType;

use super::{float_x_kernel, launch_plan, Device, Shape};

/// An sm_90 device as the CUDA runtime reports an H100 or H200.
const SM90: Device = Device {
    sms: 132,
    pdl: true,
    trigger: true,
};

/// The CUDA C++ of the launch for `shape` on [`SM90`] with `dtype` activations, expanded with
/// `client`'s runtime.
fn cuda_source<R: Runtime>(client: &ComputeClient<R>, shape: Shape, dtype: DType) -> String {
    let (plan, units, _) = launch_plan(shape, SM90, |cube_dim| ReducePlan {
        cube_dim,
        use_plane: true,
        plane_size_min: 32,
    });
    let elem = dtype.elem_type();
    let settings = KernelSettings::new(
        CubeDim::new_1d(units).into(),
        ExecutionMode::Unchecked,
        AddressType::U32,
    );
    // What the launch macro does before it hands the kernel to the server.
    let mut launcher = KernelLauncher::<R>::new(settings.clone());
    launcher.with_scope(|scope| {
        scope.device_properties(client.properties());
        scope.register_size::<DynamicSize<float_x_kernel::_NX>>(8usize);
        scope.register_type::<DynamicScalar<float_x_kernel::_F>>(elem);
    });
    // The buffers only give the arguments their kinds: nothing is launched.
    // SAFETY: the handles are never bound to a launch.
    let buffer = || unsafe { BufferArg::<R>::from_raw_parts(client.empty(256), 16) };
    use float_x_kernel::{F, NX};
    let x = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    let w = <[Vector<i32, Const<4>>] as LaunchArg>::register(buffer(), &mut launcher);
    let w_scale = <[f32] as LaunchArg>::register(buffer(), &mut launcher);
    let bias = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let residual = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let out = <[F] as LaunchArg>::register(buffer(), &mut launcher);
    let norm_w = <[Vector<F, NX>] as LaunchArg>::register(buffer(), &mut launcher);
    // Scalars (n, k, the weight's pitch in vectors, the up rows' offset, 1 / k, eps) register
    // their values; their compilation argument is `()`.
    for v in [shape.n, shape.k, shape.k.div_ceil(16), shape.n] {
        <usize as LaunchArg>::register(v, &mut launcher);
    }
    for v in [1.0 / shape.k as f32, 1e-6] {
        <f32 as LaunchArg>::register(v, &mut launcher);
    }
    let kernel = float_x_kernel::FloatXKernel::<R>::new(
        settings,
        client.clone(),
        x,
        w,
        w_scale,
        bias,
        residual,
        out,
        norm_w,
        (),
        (),
        (),
        (),
        (),
        (),
        8,
        plan,
        elem,
    );
    let options = <cubecl::cuda::CudaCompiler as Compiler>::CompilationOptions::default();
    cubecl::cuda::CudaCompiler::default()
        .compile(kernel.define(), &options)
        .unwrap_or_else(|e| panic!("{shape:?}: {e}"))
        .to_string()
}

fn cases() -> Vec<(String, Shape, DType)> {
    let linear = |bias, residual| EpilogueBlueprint::linear(bias, residual);
    let gated = EpilogueBlueprint::gated(Activation::Silu);
    let mut out = Vec::new();
    for fp8 in [false, true] {
        let format = if fp8 { "fp8" } else { "int8" };
        for (name, m, k, n, epilogue, norm) in [
            ("qkv", 1, 1536, 2048, linear(true, false), true),
            ("o", 1, 1536, 1536, linear(false, true), false),
            ("gate_up", 1, 1536, 8960, gated, true),
            ("down", 1, 8960, 1536, linear(false, true), false),
            ("gate_up_12rows", 12, 1536, 8960, gated, true),
        ] {
            let shape = Shape {
                m,
                k,
                n,
                fp8,
                epilogue,
                norm,
            };
            out.push((format!("{format}_{name}_bf16"), shape, DType::BF16));
        }
        let o = Shape {
            m: 3,
            k: 208,
            n: 33,
            fp8,
            epilogue: linear(true, true),
            norm: false,
        };
        out.push((format!("{format}_awkward_f16"), o, DType::F16));
    }
    out
}

fn case<R: Runtime>(client: &ComputeClient<R>) {
    let dir = std::env::var_os("CUBELLM_CUDA_SOURCE_DIR").map(std::path::PathBuf::from);
    for (name, shape, dtype) in cases() {
        let source = cuda_source(client, shape, dtype);
        let mmas: Vec<&str> = source.lines().filter(|l| l.contains("mma.sync")).collect();
        assert!(!mmas.is_empty(), "{name}: no mma in the source");
        if let Some(l) = mmas.iter().find(|l| l.contains("\"l\"(")) {
            panic!("{name}: an mma operand passed by address: {l}");
        }
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(format!("float_x_{name}.cu")), &source).unwrap();
        }
    }
}

#[test]
fn cuda_sources_build_for_sm90() {
    // One runtime is enough: the source does not depend on the one that expands it.
    let backend = testkit::backends()[0];
    testkit::runtime::with_runtime!(backend, |client: R| case::<R>(&client));
}
