//! The cross-runtime test harness of the cubellm crates: run each case on every runtime compiled
//! in and present, with seeded random inputs, NaN-poisoned outputs and tolerances by dtype.
//!
//! `CUBELLM_TEST_RUNTIMES=wgpu` (or `cuda`, or `cuda,wgpu`) restricts the runtimes; without it
//! every available one runs. Finding none is a failure, not a silent pass.
//!
//! A test crate writes `fn case<R: Runtime>(client: &ComputeClient<R>)` and runs it with
//! [`on_each_runtime!`]; tests whose cases capture CUDA graphs use
//! [`on_each_runtime_one_cuda_at_a_time!`].

use cubecl::prelude::*;
use ops::{caps, DType, DeviceTensor, OpsError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
pub use runtime::{self, Backend};
use std::sync::OnceLock;

pub mod cuda_source;
pub mod fuzz;

/// The runtimes the tests run on (probed once).
pub fn backends() -> &'static [Backend] {
    static BACKENDS: OnceLock<Vec<Backend>> = OnceLock::new();
    BACKENDS.get_or_init(|| {
        let found = runtime::available();
        let picked: Vec<Backend> = match std::env::var("CUBELLM_TEST_RUNTIMES") {
            Ok(list) if !list.trim().is_empty() => {
                let wanted: Vec<String> = list.split(',').map(|s| s.trim().to_lowercase()).collect();
                for w in &wanted {
                    assert!(
                        found.iter().any(|b| b.name() == w),
                        "CUBELLM_TEST_RUNTIMES asks for '{w}' but it is not available (found {found:?})"
                    );
                }
                found.into_iter().filter(|b| wanted.iter().any(|w| w == b.name())).collect()
            }
            _ => found,
        };
        assert!(
            !picked.is_empty(),
            "no runtime available to test on: install a GPU driver or mesa-vulkan-drivers"
        );
        eprintln!("testing on: {picked:?}");
        picked
    })
}

/// Runs a generic case `fn name<R: Runtime>(client: &ComputeClient<R>)` on every runtime.
#[macro_export]
macro_rules! on_each_runtime {
    ($case:ident) => {
        for &backend in $crate::backends() {
            $crate::runtime::with_runtime!(backend, |client: R| $case::<R>(&client));
        }
    };
}

/// Serialises the device work of cases that capture CUDA graphs (see
/// [`on_each_runtime_one_cuda_at_a_time!`]).
pub static CUDA_DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`on_each_runtime!`], holding [`CUDA_DEVICE`] while on CUDA. CubeCL captures CUDA graphs in
/// CUDA's global capture mode, in which a synchronising call on the device from any other
/// thread (a read, a sync) fails and invalidates the capture: cases that capture (decode
/// sessions) must not run beside other CUDA work of the same process. wgpu has no capture and
/// runs them in parallel.
#[macro_export]
macro_rules! on_each_runtime_one_cuda_at_a_time {
    ($case:ident) => {
        for &backend in $crate::backends() {
            let _one_at_a_time = (backend.name() == "cuda").then(|| {
                $crate::CUDA_DEVICE
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            });
            $crate::runtime::with_runtime!(backend, |client: R| $case::<R>(&client));
        }
    };
}

/// Float dtypes a runtime can run (bf16 only where supported).
pub fn float_dtypes<R: Runtime>(client: &ComputeClient<R>) -> Vec<DType> {
    DType::FLOATS
        .into_iter()
        .filter(|&d| caps::supports_dtype(client, d))
        .collect()
}

/// Relative tolerance by dtype: f32 1e-5, f16 1e-3, bf16 1e-2 relative to the output scale.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[-scale, scale]`, never all zero.
pub fn random(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..=scale)).collect()
}

/// `m` rows of `k` values uniform in `[-1, 1]`, row `r` scaled by `0.5 + r`: rows of different
/// root-mean-square, so that a per-row norm or scale is exercised.
pub fn rows_of_rising_scale(rng: &mut StdRng, m: usize, k: usize) -> Vec<f32> {
    let mut x = random(rng, m * k, 1.0);
    for (r, row) in x.chunks_mut(k).enumerate() {
        row.iter_mut().for_each(|v| *v *= 0.5 + r as f32);
    }
    x
}

/// The RMSNorm of the rows of `x` with weight `g` (rows of `g.len()`), rounded to `dtype` as a
/// kernel that applies the norm holds it: `F(F(x · rstd) · g)`, the normalised row rounded before
/// the weight multiplies it and the product rounded again (as `ops::norm` and Hugging Face's
/// RMSNorm do; `rstd` in f64). Against one rounding of the f64 norm, a bf16 row's codes differ
/// by a step often enough that a 16-row gated 8-bit product was off by 9% of its largest output.
pub fn rms_norm_rounded(x: &[f64], g: &[f64], eps: f32, dtype: DType) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(g.len()) {
        let rstd = ops::reference::norm::inv_rms(row, eps as f64);
        let scaled: Vec<f32> = row.iter().map(|v| (v * rstd) as f32).collect();
        let scaled = round_to(&scaled, dtype);
        let weighted: Vec<f32> = scaled.iter().zip(g).map(|(s, w)| (s * w) as f32).collect();
        out.extend(round_to(&weighted, dtype));
    }
    out
}

/// Rounds host values through `dtype` so that references see exactly what the device sees.
pub fn round_to(values: &[f32], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::F32 => values.iter().map(|&v| v as f64).collect(),
        DType::F16 => values
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f64())
            .collect(),
        DType::BF16 => values
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f64())
            .collect(),
        other => panic!("round_to: {other} is not a float dtype"),
    }
}

/// Uploads `values` as `dtype`, returning the tensor and the values as the device holds them.
pub fn upload<R: Runtime>(
    client: &ComputeClient<R>,
    values: &[f32],
    shape: &[usize],
    dtype: DType,
) -> (DeviceTensor<R>, Vec<f64>) {
    let t = DeviceTensor::from_f32(client, values, shape, dtype).expect("upload");
    (t, round_to(values, dtype))
}

/// Uploads f64 values (already representable in `dtype`, e.g. from `upload`) as `dtype`.
pub fn upload_f64<R: Runtime>(
    client: &ComputeClient<R>,
    values: &[f64],
    shape: &[usize],
    dtype: DType,
) -> DeviceTensor<R> {
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    DeviceTensor::from_f32(client, &v, shape, dtype).expect("upload")
}

/// A float tensor filled with NaN, so that elements a kernel forgets to write are caught.
pub fn poisoned<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &[usize],
    dtype: DType,
) -> DeviceTensor<R> {
    let n: usize = shape.iter().product();
    DeviceTensor::from_f32(client, &vec![f32::NAN; n], shape, dtype).expect("poison")
}

/// Compares element-wise: `|got - want| <= tol * (|want| + rms(want))`, NaN never passes.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (w.abs() + rms).max(f64::MIN_POSITIVE);
        if g.is_nan() || err.is_nan() || err > worst.1 {
            worst = (i, if g.is_nan() { f64::INFINITY } else { err });
        }
    }
    let (i, err) = worst;
    assert!(
        err <= tol,
        "{what}: element {i} got {} want {} (relative error {err:.3e} > {tol:.1e})",
        got[i],
        want[i]
    );
}

/// Compares with a tolerance relative to the norm of the whole output (attention's contract):
/// `max |got - want| <= tol * rms(want)`.
pub fn assert_close_norm(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let (i, err) = got
        .iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs()
            }
        })
        .enumerate()
        .fold((0, 0.0), |a, (i, e)| if e > a.1 { (i, e) } else { a });
    assert!(
        err <= tol * rms.max(1e-30),
        "{what}: element {i} got {} want {} (error {err:.3e} > {tol:.1e} x rms {rms:.3e})",
        got[i],
        want[i]
    );
}

/// Asserts exact equality (integer outputs).
pub fn assert_exact<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{what}: element {i} got {:?} want {:?}", got[i], want[i]);
    }
}

/// Asserts that `result` is the error kind `kind` (see [`OpsError::kind`]).
pub fn assert_err<T>(what: &str, result: Result<T, OpsError>, kind: &str) {
    match result {
        Ok(_) => panic!("{what}: expected a {kind} error, got Ok"),
        Err(e) => assert_eq!(e.kind(), kind, "{what}: expected a {kind} error, got: {e}"),
    }
}

/// The awkward row lengths every row-wise op is tested on.
pub const AWKWARD: [usize; 7] = [1, 3, 17, 33, 127, 1000, 4096];
