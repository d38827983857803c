//! Our ops called on Burn tensors of `CubeBackend<R>` (wgpu, and CUDA where present), compared
//! with the same math written with Burn's own tensor ops on the same backend.

use burn_backend::ops::FloatTensorOps;
use burn_backend::{Scalar, TensorData};
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;

use testkit::{assert_close, on_each_runtime, random, rng};

fn to_vec<R: CubeRuntime>(
    t: <CubeBackend<R> as burn_backend::BackendTypes>::FloatTensorPrimitive,
) -> Vec<f64> {
    let data = cubecl::future::block_on(CubeBackend::<R>::float_into_data(t)).expect("read");
    data.try_to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(|v| v as f64)
        .collect()
}

fn rms_norm_case<R: CubeRuntime>(_client: &ComputeClient<R>)
where
    R::Device: Default,
{
    type B<R> = CubeBackend<R>;
    let device = R::Device::default();
    let mut rng = rng(7);
    let (rows, n) = (5, 96);
    let x = random(&mut rng, rows * n, 2.0);
    let w = random(&mut rng, n, 1.0);
    let eps = 1e-6;
    let xt = B::<R>::float_from_data(TensorData::new(x.clone(), [rows, n]), &device);
    let wt = B::<R>::float_from_data(TensorData::new(w.clone(), [n]), &device);

    let ours = ops::burn::rms_norm(xt.clone(), wt.clone(), eps).expect("rms_norm on burn");

    // Burn's own arithmetic: x * 1/sqrt(mean(x^2) + eps) * w.
    let ms = B::<R>::float_mean_dim(B::<R>::float_powi_scalar(xt.clone(), Scalar::Int(2)), 1);
    let inv = B::<R>::float_recip(B::<R>::float_sqrt(B::<R>::float_add_scalar(
        ms,
        Scalar::Float(eps as f64),
    )));
    let w2 = B::<R>::float_reshape(wt, [1, n].into());
    let want = B::<R>::float_mul(B::<R>::float_mul(xt, inv), w2);

    assert_close(
        "burn rms_norm",
        &to_vec::<R>(ours),
        &to_vec::<R>(want),
        1e-5,
    );
}

fn fused_rmsnorm_rope_case<R: CubeRuntime>(_client: &ComputeClient<R>)
where
    R::Device: Default,
{
    type B<R> = CubeBackend<R>;
    let device = R::Device::default();
    let mut rng = rng(8);
    let (b, s, heads, d) = (2, 5, 3, 16);
    let h = heads * d;
    let x = random(&mut rng, b * s * h, 2.0);
    let w = random(&mut rng, h, 1.0);
    // Hugging Face's tables: the angle of frequency j repeated in both halves of the head.
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for pos in 0..s {
        for i in 0..d {
            let j = i % (d / 2);
            let angle = pos as f32 * 10000f32.powf(-2.0 * j as f32 / d as f32);
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    let eps = 1e-6;
    let xt = B::<R>::float_from_data(TensorData::new(x, [b, s, h]), &device);
    let wt = B::<R>::float_from_data(TensorData::new(w, [h]), &device);
    let ct = B::<R>::float_from_data(TensorData::new(cos, [s, d]), &device);
    let st = B::<R>::float_from_data(TensorData::new(sin, [s, d]), &device);

    let ours =
        ops::burn::fused_rmsnorm_rope(xt.clone(), wt.clone(), ct.clone(), st.clone(), eps, None)
            .expect("fused_rmsnorm_rope on burn");

    // Burn's own arithmetic: RMSNorm over h, then per head x * cos + rotate_half(x) * sin.
    let ms = B::<R>::float_mean_dim(B::<R>::float_powi_scalar(xt.clone(), Scalar::Int(2)), 2);
    let inv = B::<R>::float_recip(B::<R>::float_sqrt(B::<R>::float_add_scalar(
        ms,
        Scalar::Float(eps as f64),
    )));
    let normed = B::<R>::float_mul(
        B::<R>::float_mul(xt, inv),
        B::<R>::float_reshape(wt, [1, 1, h].into()),
    );
    let q = B::<R>::float_reshape(normed, [b, s, heads, d].into());
    let first = B::<R>::float_slice(
        q.clone(),
        &[
            (0..b).into(),
            (0..s).into(),
            (0..heads).into(),
            (0..d / 2).into(),
        ],
    );
    let second = B::<R>::float_slice(
        q.clone(),
        &[
            (0..b).into(),
            (0..s).into(),
            (0..heads).into(),
            (d / 2..d).into(),
        ],
    );
    let rotated = B::<R>::float_cat(vec![B::<R>::float_neg(second), first], 3);
    let c = B::<R>::float_reshape(ct, [1, s, 1, d].into());
    let sn = B::<R>::float_reshape(st, [1, s, 1, d].into());
    let want = B::<R>::float_add(B::<R>::float_mul(q, c), B::<R>::float_mul(rotated, sn));
    let want = B::<R>::float_reshape(want, [b, s, h].into());

    assert_close(
        "burn fused_rmsnorm_rope",
        &to_vec::<R>(ours),
        &to_vec::<R>(want),
        1e-5,
    );
}

#[test]
fn rms_norm_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(rms_norm_case);
}

#[test]
fn fused_rmsnorm_rope_on_burn_matches_burn_arithmetic() {
    on_each_runtime!(fused_rmsnorm_rope_case);
}
