//! Our ops called on Burn tensors of `CubeBackend<WgpuRuntime>`, compared with the same math
//! written with Burn's own tensor ops on the same backend.

use burn_backend::ops::FloatTensorOps;
use burn_backend::{Scalar, TensorData};
use burn_cubecl::CubeBackend;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};

use crate::harness::{assert_close, random, rng};

type B = CubeBackend<WgpuRuntime>;

fn to_vec(t: <B as burn_backend::BackendTypes>::FloatTensorPrimitive) -> Vec<f64> {
    let data = cubecl::future::block_on(B::float_into_data(t)).expect("read");
    data.try_to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(|v| v as f64)
        .collect()
}

#[test]
fn rms_norm_on_burn_matches_burn_arithmetic() {
    assert!(
        cubellm::runtime::probe_wgpu().is_ok(),
        "the Burn interop test needs the wgpu runtime (install mesa-vulkan-drivers)"
    );
    let device = WgpuDevice::default();
    let mut rng = rng(7);
    let (rows, n) = (5, 96);
    let x = random(&mut rng, rows * n, 2.0);
    let w = random(&mut rng, n, 1.0);
    let eps = 1e-6;
    let xt = B::float_from_data(TensorData::new(x.clone(), [rows, n]), &device);
    let wt = B::float_from_data(TensorData::new(w.clone(), [n]), &device);

    let ours = ops::burn::rms_norm(xt.clone(), wt.clone(), eps).expect("rms_norm on burn");

    // Burn's own arithmetic: x * 1/sqrt(mean(x^2) + eps) * w.
    let ms = B::float_mean_dim(B::float_powi_scalar(xt.clone(), Scalar::Int(2)), 1);
    let inv = B::float_recip(B::float_sqrt(B::float_add_scalar(
        ms,
        Scalar::Float(eps as f64),
    )));
    let w2 = B::float_reshape(wt, [1, n].into());
    let want = B::float_mul(B::float_mul(xt, inv), w2);

    assert_close("burn rms_norm", &to_vec(ours), &to_vec(want), 1e-5);
}
