//! Bad dtypes and shapes given to the Burn ops come back as `OpsError`s, never as panics.

use super::rows::has_int;
use super::*;
use burn_backend::IntDType;
use ops::caps;
use ops::matmul::Activation;
use ops::rope::RopeCache;
use testkit::assert_err;

fn float<R: CubeRuntime>(shape: &[usize]) -> T<R> {
    let n = shape.iter().product();
    input::<R>(&vec![0.5; n], shape, DType::F32).0
}

fn int<R: CubeRuntime>(shape: &[usize]) -> T<R> {
    let n: usize = shape.iter().product();
    B::<R>::int_from_data(
        TensorData::new(vec![1i32; n], shape.to_vec()),
        &device::<R>(),
    )
}

fn bad_dtype_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    use ops::burn::*;
    // An int tensor where a float one is expected, first operand or a later one.
    assert_err(
        "rms_norm int x",
        rms_norm(int::<R>(&[4, 8]), float::<R>(&[8]), 1e-6),
        "dtype",
    );
    assert_err(
        "rms_norm_residual int residual",
        rms_norm_residual(
            float::<R>(&[4, 8]),
            int::<R>(&[4, 8]),
            float::<R>(&[8]),
            1e-6,
        ),
        "dtype",
    );
    assert_err("softmax int", softmax(int::<R>(&[4, 8])), "dtype");
    assert_err(
        "argmax int",
        argmax(int::<R>(&[4, 8]), IntDType::I32),
        "dtype",
    );
    assert_err(
        "linear int weight",
        linear(float::<R>(&[4, 8]), int::<R>(&[6, 8]), None, None),
        "dtype",
    );
    assert_err(
        "linear int bias",
        linear(
            float::<R>(&[4, 8]),
            float::<R>(&[6, 8]),
            Some(int::<R>(&[6])),
            None,
        ),
        "dtype",
    );
    assert_err(
        "gated_mlp int up",
        gated_mlp(
            float::<R>(&[4, 8]),
            float::<R>(&[6, 8]),
            int::<R>(&[6, 8]),
            Activation::Silu,
        ),
        "dtype",
    );
    assert_err(
        "attention int k",
        attention(
            float::<R>(&[4, 2, 8]),
            int::<R>(&[4, 2, 8]),
            float::<R>(&[4, 2, 8]),
            0.3,
            true,
        ),
        "dtype",
    );
    assert_err(
        "attention_cached int q",
        attention_cached(
            int::<R>(&[1, 2, 8]),
            float::<R>(&[4, 2, 8]),
            float::<R>(&[4, 2, 8]),
            2,
            0.3,
        ),
        "dtype",
    );
    let cache = RopeCache::new(client, 16, 8, 10000.0).unwrap();
    assert_err(
        "rope int x",
        rope(int::<R>(&[2, 1, 8]), &[0, 1], &cache),
        "dtype",
    );
    // Float ids, and an int table.
    assert_err(
        "embedding float ids",
        embedding(float::<R>(&[10, 8]), float::<R>(&[3])),
        "dtype",
    );
    assert_err(
        "embedding int table",
        embedding(int::<R>(&[10, 8]), int::<R>(&[3])),
        "dtype",
    );
    // The caches are left as they were by a refused write.
    let (mut k_cache, mut v_cache) = (float::<R>(&[4, 2, 8]), float::<R>(&[4, 2, 8]));
    assert_err(
        "kv_cache_write int v",
        kv_cache_write(
            &mut k_cache,
            &mut v_cache,
            float::<R>(&[1, 2, 8]),
            int::<R>(&[1, 2, 8]),
            0,
        ),
        "dtype",
    );
    assert!(read(k_cache)
        .iter()
        .chain(&read(v_cache))
        .all(|&x| x == 0.5));
    // An out dtype the runtime lacks.
    for d in [IntDType::I64, IntDType::U64, IntDType::I16] {
        if !has_int(client, d) {
            assert_err(
                "argmax to an int dtype the runtime lacks",
                argmax(float::<R>(&[4, 8]), d),
                "dtype",
            );
        }
    }
    // bf16 where the runtime has none: refused before Burn would copy a strided input.
    if !caps::supports_dtype(client, DType::BF16) {
        let bf16 = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let data = TensorData::new(vec![burn_backend::bf16::from_f32(0.5); n], shape.to_vec());
            B::<R>::float_from_data(data, &device::<R>())
        };
        assert_err(
            "rms_norm bf16",
            rms_norm(bf16(&[4, 8]), bf16(&[8]), 1e-6),
            "dtype",
        );
        let strided = B::<R>::float_swap_dims(bf16(&[8, 4]), 0, 1);
        assert_err("softmax strided bf16", softmax(strided), "dtype");
    }
}

fn bad_shape_case<R: CubeRuntime>(client: &ComputeClient<R>) {
    use ops::burn::*;
    assert_err(
        "rms_norm weight of another length",
        rms_norm(float::<R>(&[4, 8]), float::<R>(&[7]), 1e-6),
        "shape",
    );
    assert_err(
        "rms_norm negative eps",
        rms_norm(float::<R>(&[4, 8]), float::<R>(&[8]), -1.0),
        "argument",
    );
    assert_err(
        "rms_norm_residual residual of another shape",
        rms_norm_residual(
            float::<R>(&[4, 8]),
            float::<R>(&[3, 8]),
            float::<R>(&[8]),
            1e-6,
        ),
        "shape",
    );
    assert_err(
        "fused_rmsnorm_rope tables of another length",
        fused_rmsnorm_rope(
            float::<R>(&[1, 5, 16]),
            float::<R>(&[16]),
            float::<R>(&[4, 8]),
            float::<R>(&[4, 8]),
            1e-6,
            None,
        ),
        "shape",
    );
    let cache = RopeCache::new(client, 16, 8, 10000.0).unwrap();
    assert_err(
        "rope position past the cache",
        rope(float::<R>(&[2, 1, 8]), &[3, 16], &cache),
        "argument",
    );
    assert_err(
        "rope one position for two tokens",
        rope(float::<R>(&[2, 1, 8]), &[3], &cache),
        "shape",
    );
    assert_err(
        "rope head dim of another cache",
        rope(float::<R>(&[2, 1, 16]), &[0, 1], &cache),
        "shape",
    );
    assert_err(
        "linear K mismatch",
        linear(float::<R>(&[4, 8]), float::<R>(&[6, 9]), None, None),
        "shape",
    );
    assert_err(
        "linear bias of another length",
        linear(
            float::<R>(&[4, 8]),
            float::<R>(&[6, 8]),
            Some(float::<R>(&[5])),
            None,
        ),
        "shape",
    );
    assert_err(
        "linear residual of another shape",
        linear(
            float::<R>(&[4, 8]),
            float::<R>(&[6, 8]),
            None,
            Some(float::<R>(&[4, 8])),
        ),
        "shape",
    );
    assert_err(
        "gated_mlp gate and up differ",
        gated_mlp(
            float::<R>(&[4, 8]),
            float::<R>(&[6, 8]),
            float::<R>(&[5, 8]),
            Activation::Gelu,
        ),
        "shape",
    );
    assert_err(
        "attention query heads not a multiple of KV heads",
        attention(
            float::<R>(&[4, 3, 8]),
            float::<R>(&[4, 2, 8]),
            float::<R>(&[4, 2, 8]),
            0.3,
            true,
        ),
        "shape",
    );
    assert_err(
        "attention causal with more queries than keys",
        attention(
            float::<R>(&[5, 2, 8]),
            float::<R>(&[4, 2, 8]),
            float::<R>(&[4, 2, 8]),
            0.3,
            true,
        ),
        "argument",
    );
    assert_err(
        "attention_cached length past the cache",
        attention_cached(
            float::<R>(&[1, 2, 8]),
            float::<R>(&[4, 2, 8]),
            float::<R>(&[4, 2, 8]),
            5,
            0.3,
        ),
        "argument",
    );
    let (mut k_cache, mut v_cache) = (float::<R>(&[4, 2, 8]), float::<R>(&[4, 2, 8]));
    let new = || input::<R>(&[1.0; 32], &[2, 2, 8], DType::F32).0;
    assert_err(
        "kv_cache_write past the cache",
        kv_cache_write(&mut k_cache, &mut v_cache, new(), new(), 3),
        "argument",
    );
    assert_err(
        "kv_cache_write rows of another head dim",
        kv_cache_write(
            &mut k_cache,
            &mut v_cache,
            float::<R>(&[1, 2, 4]),
            float::<R>(&[1, 2, 4]),
            0,
        ),
        "shape",
    );
    assert!(
        read(k_cache)
            .iter()
            .chain(&read(v_cache))
            .all(|&x| x == 0.5),
        "a refused write changed a cache"
    );
    assert_err(
        "embedding table of rank 3",
        embedding(float::<R>(&[2, 10, 8]), int::<R>(&[3])),
        "shape",
    );
    assert_err(
        "argmax to u8 over rows of 300",
        argmax(float::<R>(&[2, 300]), IntDType::U8),
        "argument",
    );
}

#[test]
fn burn_ops_refuse_bad_dtypes_with_errors() {
    on_each_runtime!(bad_dtype_case);
}

#[test]
fn burn_ops_refuse_bad_shapes_with_errors() {
    on_each_runtime!(bad_shape_case);
}
