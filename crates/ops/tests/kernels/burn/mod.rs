//! Our ops called on Burn tensors of `CubeBackend<R>` (wgpu, and CUDA where present), compared
//! with the same math written with Burn's own tensor ops on the same backend. Each op runs in
//! every float dtype the runtime has (`testkit::float_dtypes`) on inputs rounded to that dtype;
//! Burn's arithmetic runs in f32 on the same rounded values. Every op is also given a
//! non-contiguous input (a `float_swap_dims` view), which it must copy before its kernel reads it.

mod attention;
mod errors;
mod matmul;
mod norm;
mod rows;

use burn_backend::ops::{FloatTensorOps, IntTensorOps};
use burn_backend::{FloatDType, Scalar, TensorData};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;
use ops::DType;
use testkit::{assert_close, float_dtypes, on_each_runtime, random, rng, round_to, tolerance};

type B<R> = CubeBackend<R>;
type T<R> = CubeTensor<R>;

fn device<R: CubeRuntime>() -> R::Device {
    R::Device::default()
}

fn burn_float(dtype: DType) -> FloatDType {
    match dtype {
        DType::F32 => FloatDType::F32,
        DType::F16 => FloatDType::F16,
        DType::BF16 => FloatDType::BF16,
        other => panic!("{other} is not a float dtype"),
    }
}

/// `values` rounded to `dtype`, as a Burn tensor of `dtype` (the op's input) and as one of f32
/// (the reference's input): the same numbers in both.
fn input<R: CubeRuntime>(values: &[f32], shape: &[usize], dtype: DType) -> (T<R>, T<R>) {
    let rounded: Vec<f32> = round_to(values, dtype)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let reference =
        B::<R>::float_from_data(TensorData::new(rounded, shape.to_vec()), &device::<R>());
    let t = B::<R>::float_cast(reference.clone(), burn_float(dtype));
    (t, reference)
}

/// `values` (row-major for `shape`) laid out with dimensions `a` and `b` swapped, and that
/// layout's shape.
fn swapped_layout<E: Copy + Default>(
    values: &[E],
    shape: &[usize],
    a: usize,
    b: usize,
) -> (Vec<E>, Vec<usize>) {
    let mut stored_shape = shape.to_vec();
    stored_shape.swap(a, b);
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * stored_shape[i + 1];
    }
    let mut out = vec![E::default(); values.len()];
    let mut index = vec![0usize; shape.len()];
    for (flat, &v) in values.iter().enumerate() {
        let mut rest = flat;
        for k in (0..shape.len()).rev() {
            index[k] = rest % shape[k];
            rest /= shape[k];
        }
        index.swap(a, b);
        let offset: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out[offset] = v;
    }
    (out, stored_shape)
}

/// [`input`], but stored with dimensions `a` and `b` swapped and handed over as Burn's
/// `float_swap_dims` view of that storage: the same logical tensor, not contiguous.
fn input_strided<R: CubeRuntime>(
    values: &[f32],
    shape: &[usize],
    dtype: DType,
    (a, b): (usize, usize),
) -> (T<R>, T<R>) {
    let (stored, stored_shape) = swapped_layout(values, shape, a, b);
    let (t, reference) = input::<R>(&stored, &stored_shape, dtype);
    let t = B::<R>::float_swap_dims(t, a, b);
    assert!(
        !t.is_contiguous(),
        "the strided input must not be contiguous"
    );
    (t, B::<R>::float_swap_dims(reference, a, b))
}

/// The last two dimensions swapped (the usual strided input).
fn last_two(shape: &[usize]) -> (usize, usize) {
    (shape.len() - 2, shape.len() - 1)
}

fn read<R: CubeRuntime>(t: T<R>) -> Vec<f64> {
    let data = cubecl::future::block_on(B::<R>::float_into_data(t)).expect("read");
    data.iter::<f32>().map(|v| v as f64).collect()
}

fn read_int<R: CubeRuntime>(t: T<R>) -> Vec<i64> {
    let data = cubecl::future::block_on(B::<R>::int_into_data(t)).expect("read");
    data.iter::<i64>().collect()
}

fn shape_of<R: CubeRuntime>(t: &T<R>) -> Vec<usize> {
    t.meta.shape().iter().copied().collect()
}

/// Checks an output's dtype and shape, then its values against `want` (an f32 Burn tensor).
fn check<R: CubeRuntime>(what: &str, got: T<R>, want: T<R>, dtype: DType, tol: f64) {
    assert_eq!(
        got.dtype,
        burn_backend::DType::from(burn_float(dtype)),
        "{what}: dtype"
    );
    assert_eq!(shape_of(&got), shape_of(&want), "{what}: shape");
    assert_close(what, &read(got), &read(want), tol);
}

/// `[1, .., 1, n]` for broadcasting a vector against a tensor of rank `rank`.
fn row_vector<R: CubeRuntime>(t: T<R>, rank: usize) -> T<R> {
    let n = t.meta.num_elements();
    let mut shape = vec![1; rank];
    shape[rank - 1] = n;
    B::<R>::float_reshape(t, shape.into())
}

/// Burn's arithmetic: `x * 1/sqrt(mean(x²) + eps) * w` over the last dimension.
fn rms_norm_ref<R: CubeRuntime>(x: T<R>, w: T<R>, eps: f32) -> T<R> {
    let rank = x.meta.shape().len();
    let ms = B::<R>::float_mean_dim(B::<R>::float_mul(x.clone(), x.clone()), rank - 1);
    let inv = B::<R>::float_recip(B::<R>::float_sqrt(B::<R>::float_add_scalar(
        ms,
        Scalar::Float(eps as f64),
    )));
    B::<R>::float_mul(B::<R>::float_mul(x, inv), row_vector::<R>(w, rank))
}

/// Burn's arithmetic: softmax over the last dimension.
fn softmax_ref<R: CubeRuntime>(x: T<R>) -> T<R> {
    let last = x.meta.shape().len() - 1;
    let max = B::<R>::float_max_dim(x.clone(), last);
    let e = B::<R>::float_exp(B::<R>::float_sub(x, max));
    let sum = B::<R>::float_sum_dim(e.clone(), last);
    B::<R>::float_div(e, sum)
}

/// Burn's arithmetic for `a[.., M, K] · b[.., N, K]ᵀ`: a broadcast product summed over K. Not
/// `float_matmul`: on CUDA, Burn runs f32 products on TF32 tensor cores (about 1e-3 relative
/// error), too coarse for a reference.
fn matmul_nt<R: CubeRuntime>(a: T<R>, b: T<R>) -> T<R> {
    let (sa, sb) = (shape_of(&a), shape_of(&b));
    let r = sa.len();
    let mut a_shape = sa.clone();
    a_shape.insert(r - 1, 1);
    let mut b_shape = sb.clone();
    b_shape.insert(r - 2, 1);
    let products = B::<R>::float_mul(
        B::<R>::float_reshape(a, a_shape.into()),
        B::<R>::float_reshape(b, b_shape.into()),
    );
    let sums = B::<R>::float_sum_dim(products, r);
    let mut out = sa[..r - 1].to_vec();
    out.push(sb[r - 2]);
    B::<R>::float_reshape(sums, out.into())
}

/// Burn's arithmetic: `x · wᵀ` for `x[.., K]` and `w[N, K]`.
fn matmul_wt<R: CubeRuntime>(x: T<R>, w: T<R>) -> T<R> {
    let mut shape = shape_of(&x);
    let k = shape.pop().expect("rank >= 1");
    let m: usize = shape.iter().product();
    let n = w.meta.shape()[0];
    let y = matmul_nt::<R>(B::<R>::float_reshape(x, [m, k].into()), w);
    shape.push(n);
    B::<R>::float_reshape(y, shape.into())
}
