//! Picking a runtime by name (`cuda`, `wgpu`, `auto`) and running generic code on it.
//!
//! Creating a CubeCL client on a machine without the device panics inside cubecl, so the
//! availability of each runtime is probed first (libcuda + a device for CUDA, an adapter for
//! wgpu) and a missing one is a [`RuntimeError`], never a panic.

pub mod kernel_cache;

use std::fmt;
use std::str::FromStr;

pub use cubecl;

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuntimeChoice {
    Cuda,
    Wgpu,
    /// CUDA when a CUDA device is present, else wgpu.
    #[default]
    Auto,
}

impl FromStr for RuntimeChoice {
    type Err = RuntimeError;
    fn from_str(s: &str) -> Result<Self, RuntimeError> {
        match s.to_ascii_lowercase().as_str() {
            "cuda" => Ok(Self::Cuda),
            "wgpu" => Ok(Self::Wgpu),
            "auto" => Ok(Self::Auto),
            other => Err(RuntimeError::Unknown(other.to_string())),
        }
    }
}

/// A runtime that is compiled in and has a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    #[cfg(feature = "cuda")]
    Cuda,
    #[cfg(feature = "wgpu")]
    Wgpu,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "cuda")]
            Backend::Cuda => "cuda",
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => "wgpu",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum RuntimeError {
    #[error("unknown runtime '{0}' (expected cuda, wgpu or auto)")]
    Unknown(String),
    #[error("the {0} runtime is not compiled into this binary (enable the '{0}' feature)")]
    NotCompiled(&'static str),
    #[error("the {runtime} runtime has no usable device: {reason}")]
    NoDevice {
        runtime: &'static str,
        reason: String,
    },
}

/// Whether a CUDA device can be used: libcuda and libnvrtc load and at least one device exists.
pub fn probe_cuda() -> Result<Backend, RuntimeError> {
    #[cfg(feature = "cuda")]
    {
        let no = |reason: String| RuntimeError::NoDevice {
            runtime: "cuda",
            reason,
        };
        // SAFETY: only loads the shared libraries; no CUDA call is made before the check.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(no("libcuda (the NVIDIA driver) was not found".into()));
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(no(
                "libnvrtc (the CUDA runtime compiler) was not found".into()
            ));
        }
        cudarc::driver::result::init().map_err(|e| no(format!("cuInit failed: {e:?}")))?;
        let count = cudarc::driver::result::device::get_count()
            .map_err(|e| no(format!("cannot count devices: {e:?}")))?;
        if count == 0 {
            return Err(no("no CUDA device".into()));
        }
        Ok(Backend::Cuda)
    }
    #[cfg(not(feature = "cuda"))]
    Err(RuntimeError::NotCompiled("cuda"))
}

/// Whether wgpu finds an adapter (a GPU, or a software one such as Mesa's lavapipe).
pub fn probe_wgpu() -> Result<Backend, RuntimeError> {
    #[cfg(feature = "wgpu")]
    {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let adapters =
            cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
        if adapters.is_empty() {
            return Err(RuntimeError::NoDevice {
                runtime: "wgpu",
                reason: "no Vulkan/Metal/DX12 adapter (on a machine without a GPU, install \
                         mesa-vulkan-drivers)"
                    .into(),
            });
        }
        Ok(Backend::Wgpu)
    }
    #[cfg(not(feature = "wgpu"))]
    Err(RuntimeError::NotCompiled("wgpu"))
}

/// Bytes free on the device of `client`, as its driver reports them (`None` where the runtime
/// does not say: wgpu has no such query). CubeCL reports only its own limit on one allocation,
/// so a caller that wants to check a whole model against the device asks here.
pub fn free_memory<R: cubecl::Runtime>(_client: &cubecl::client::ComputeClient<R>) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if std::any::TypeId::of::<R>() == std::any::TypeId::of::<Cuda>() {
        return cuda_free_memory();
    }
    None
}

#[cfg(feature = "cuda")]
fn cuda_free_memory() -> Option<u64> {
    use cudarc::driver::result;
    result::init().ok()?;
    // Device 0 is the one `CudaDevice::default()` names (the only one `with_runtime!` uses). The primary context is the one CubeCL
    // uses (retaining it again only raises its reference count); it must be current on this
    // thread for cuMemGetInfo.
    let dev = result::device::get(0).ok()?;
    // SAFETY: `dev` is a valid device; the context is released below, after the query.
    unsafe {
        let ctx = result::primary_ctx::retain(dev).ok()?;
        let free = result::ctx::set_current(ctx)
            .ok()
            .and_then(|_| result::mem_get_info().ok())
            .map(|(free, _total)| free as u64);
        let _ = result::primary_ctx::release(dev);
        free
    }
}

/// Resolves a choice to a backend with a device.
pub fn resolve(choice: RuntimeChoice) -> Result<Backend, RuntimeError> {
    match choice {
        RuntimeChoice::Cuda => probe_cuda(),
        RuntimeChoice::Wgpu => probe_wgpu(),
        RuntimeChoice::Auto => probe_cuda().or_else(|cuda| {
            probe_wgpu().map_err(|wgpu| RuntimeError::NoDevice {
                runtime: "auto",
                reason: format!("{cuda}; {wgpu}"),
            })
        }),
    }
}

/// Every backend compiled in that has a device, CUDA first.
pub fn available() -> Vec<Backend> {
    [probe_cuda(), probe_wgpu()]
        .into_iter()
        .filter_map(Result::ok)
        .collect()
}

/// Runs `$body` with `$client` bound to a `ComputeClient` of the runtime `$backend` names, and
/// `$rt` to the runtime type. The body is instantiated once per runtime compiled into this
/// crate (its `cuda` / `wgpu` features decide, not the caller's).
///
/// ```ignore
/// let out = runtime::with_runtime!(backend, |client: R| my_generic_fn::<R>(&client));
/// ```
#[macro_export]
macro_rules! with_runtime {
    ($backend:expr, |$client:ident : $rt:ident| $body:expr) => {{
        let backend: $crate::Backend = $backend;
        #[allow(unreachable_code)]
        let out = 'with_runtime: {
            $crate::__with_cuda!('with_runtime, backend, $client, $rt, $body);
            $crate::__with_wgpu!('with_runtime, backend, $client, $rt, $body);
            unreachable!("every Backend variant is a compiled runtime")
        };
        out
    }};
}

// One arm per runtime, defined according to this crate's features (a `#[cfg]` inside an
// exported macro would be evaluated with the features of the crate that expands it).
#[cfg(feature = "cuda")]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cuda {
    ($label:lifetime, $backend:ident, $client:ident, $rt:ident, $body:expr) => {
        if $backend == $crate::Backend::Cuda {
            type $rt = $crate::Cuda;
            let $client = <$rt as $crate::cubecl::Runtime>::client(&Default::default());
            break $label $body;
        }
    };
}
#[cfg(not(feature = "cuda"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_cuda {
    ($($t:tt)*) => {};
}
#[cfg(feature = "wgpu")]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_wgpu {
    ($label:lifetime, $backend:ident, $client:ident, $rt:ident, $body:expr) => {
        if $backend == $crate::Backend::Wgpu {
            type $rt = $crate::Wgpu;
            let $client = <$rt as $crate::cubecl::Runtime>::client(&Default::default());
            break $label $body;
        }
    };
}
#[cfg(not(feature = "wgpu"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __with_wgpu {
    ($($t:tt)*) => {};
}

#[cfg(feature = "cuda")]
pub type Cuda = cubecl::cuda::CudaRuntime;
#[cfg(feature = "wgpu")]
pub type Wgpu = cubecl::wgpu::WgpuRuntime;

/// Turns the CUDA runtime's programmatic dependent launch (Hopper and newer) on (the default) or
/// off for the whole process, for comparing the two. Call it before the first client is created;
/// pair it with `ops::caps::set_programmatic_launch` so that the kernels know. No effect on wgpu.
pub fn set_programmatic_launch(enabled: bool) {
    #[cfg(feature = "cuda")]
    cubecl::cuda::set_programmatic_launch(enabled);
    #[cfg(not(feature = "cuda"))]
    let _ = enabled;
}
