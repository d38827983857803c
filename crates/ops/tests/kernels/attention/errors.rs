//! Bad inputs are errors of the right kind, never a panic or a wrong answer.

use super::*;
use ops::attention::{
    attention, attention_cached_into, attention_into, kv_cache_write_into, AttentionWorkspace,
    KvLen,
};
use ops::DeviceTensor;

fn attention_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let t = |shape: &[usize], dtype: DType| {
        let n: usize = shape.iter().product();
        DeviceTensor::from_f32(client, &vec![0.5; n], shape, dtype).unwrap()
    };
    let f = DType::F32;
    let q = t(&[3, 4, 8], f);
    let k = t(&[5, 2, 8], f);
    let v = t(&[5, 2, 8], f);
    assert!(attention(client, &q, &k, &v, 0.3, true).is_ok());
    assert_err(
        "k dtype",
        attention(client, &q, &t(&[5, 2, 8], DType::F16), &v, 0.3, false),
        "dtype",
    );
    assert_err(
        "int q",
        attention(
            client,
            &DeviceTensor::from_slice(client, &[1i32; 96], &[3, 4, 8]).unwrap(),
            &k,
            &v,
            0.3,
            false,
        ),
        "dtype",
    );
    assert_err(
        "v shape",
        attention(client, &q, &k, &t(&[4, 2, 8], f), 0.3, false),
        "shape",
    );
    assert_err(
        "head dim",
        attention(client, &q, &t(&[5, 2, 4], f), &t(&[5, 2, 4], f), 0.3, false),
        "shape",
    );
    assert_err(
        "heads not a multiple",
        attention(client, &q, &t(&[5, 3, 8], f), &t(&[5, 3, 8], f), 0.3, false),
        "shape",
    );
    assert_err(
        "rank",
        attention(client, &t(&[12, 8], f), &k, &v, 0.3, false),
        "shape",
    );
    assert_err(
        "rank mix",
        attention(client, &t(&[1, 3, 4, 8], f), &k, &v, 0.3, false),
        "shape",
    );
    assert_err(
        "batch mismatch",
        attention(
            client,
            &t(&[2, 3, 4, 8], f),
            &t(&[3, 5, 2, 8], f),
            &t(&[3, 5, 2, 8], f),
            0.3,
            false,
        ),
        "shape",
    );
    assert_err(
        "head dim too large",
        attention(
            client,
            &t(&[1, 1, 264], f),
            &t(&[1, 1, 264], f),
            &t(&[1, 1, 264], f),
            0.3,
            false,
        ),
        "shape",
    );
    assert_err(
        "causal lq > lk",
        attention(client, &t(&[6, 4, 8], f), &k, &v, 0.3, true),
        "argument",
    );
    assert!(attention(client, &t(&[6, 4, 8], f), &k, &v, 0.3, false).is_ok());
    assert_err(
        "nan scale",
        attention(client, &q, &k, &v, f32::NAN, false),
        "argument",
    );
    assert_err(
        "out shape",
        attention_into(client, &q, &k, &v, 0.3, false, &t(&[3, 4, 9], f)),
        "shape",
    );
    assert_err(
        "out dtype",
        attention_into(client, &q, &k, &v, 0.3, false, &t(&[3, 4, 8], DType::F16)),
        "dtype",
    );
    let strided = t(&[8, 4, 3], f).view(&[3, 4, 8], &[1, 3, 12]).unwrap();
    assert_err(
        "non-contiguous",
        attention(client, &strided, &k, &v, 0.3, false),
        "shape",
    );
    if !caps::supports_dtype(client, DType::BF16) {
        let b = DType::BF16;
        assert_err(
            "bf16 unsupported",
            attention(
                client,
                &t(&[3, 4, 8], b),
                &t(&[5, 2, 8], b),
                &t(&[5, 2, 8], b),
                0.3,
                false,
            ),
            "dtype",
        );
    }
    if !caps::has_plane_ops(client) {
        assert_err(
            "decode needs plane ops",
            attention_into_with(
                client,
                &q,
                &k,
                &v,
                0.3,
                false,
                &t(&[3, 4, 8], f),
                AttentionStrategy::Decode,
            ),
            "feature",
        );
    }
    assert_err(
        "tensor cores need f16/bf16",
        attention_into_with(
            client,
            &q,
            &k,
            &v,
            0.3,
            false,
            &t(&[3, 4, 8], f),
            AttentionStrategy::TensorCore(FlashTiling::default()),
        ),
        "feature",
    );
    // Tile values the tensor-core kernels cannot be built with are rejected on every runtime,
    // before the runtime's capabilities are looked at.
    let bad_tilings = [
        AttentionStrategy::TensorCore(FlashTiling { warps: 3, bk: 64 }),
        AttentionStrategy::TensorCore(FlashTiling { warps: 4, bk: 24 }),
        AttentionStrategy::TensorCore(FlashTiling { warps: 4, bk: 256 }),
        AttentionStrategy::TensorCoreDecode(SplitKvTiling {
            warps: 4,
            bk: 32,
            cubes_per_sm: 1,
        }),
        AttentionStrategy::TensorCoreDecode(SplitKvTiling {
            warps: 0,
            bk: 64,
            cubes_per_sm: 1,
        }),
        AttentionStrategy::TensorCoreDecode(SplitKvTiling {
            warps: 4,
            bk: 64,
            cubes_per_sm: 0,
        }),
        AttentionStrategy::TensorCoreDecode(SplitKvTiling {
            warps: 4,
            bk: 64,
            cubes_per_sm: 9,
        }),
    ];
    for strategy in bad_tilings {
        assert_err(
            &format!("{strategy:?}"),
            attention_into_with(client, &q, &k, &v, 0.3, false, &t(&[3, 4, 8], f), strategy),
            "argument",
        );
    }

    // The cached form.
    let kc = t(&[10, 2, 8], f);
    let vc = t(&[10, 2, 8], f);
    let out = t(&[3, 4, 8], f);
    let len_ok = DeviceTensor::from_slice(client, &[4u32], &[1]).unwrap();
    assert!(attention_cached_into(client, &q, &kc, &vc, KvLen::Host(4), 0.3, &out, None).is_ok());
    assert!(attention_cached_into(
        client,
        &q,
        &kc,
        &vc,
        KvLen::Device(&len_ok),
        0.3,
        &out,
        None
    )
    .is_ok());
    assert_err(
        "len past cache",
        attention_cached_into(client, &q, &kc, &vc, KvLen::Host(11), 0.3, &out, None),
        "argument",
    );
    assert_err(
        "len below lq",
        attention_cached_into(client, &q, &kc, &vc, KvLen::Host(2), 0.3, &out, None),
        "argument",
    );
    assert_err(
        "len zero",
        attention_cached_into(
            client,
            &t(&[1, 4, 8], f),
            &kc,
            &vc,
            KvLen::Host(0),
            0.3,
            &t(&[1, 4, 8], f),
            None,
        ),
        "argument",
    );
    let len_i32 = DeviceTensor::from_slice(client, &[4i32], &[1]).unwrap();
    assert_err(
        "len dtype",
        attention_cached_into(
            client,
            &q,
            &kc,
            &vc,
            KvLen::Device(&len_i32),
            0.3,
            &out,
            None,
        ),
        "dtype",
    );
    let len_2 = DeviceTensor::from_slice(client, &[4u32, 4], &[2]).unwrap();
    assert_err(
        "len shape",
        attention_cached_into(client, &q, &kc, &vc, KvLen::Device(&len_2), 0.3, &out, None),
        "shape",
    );
    assert_err(
        "cached batch",
        attention_cached_into(
            client,
            &t(&[1, 3, 4, 8], f),
            &t(&[1, 10, 2, 8], f),
            &t(&[1, 10, 2, 8], f),
            KvLen::Host(4),
            0.3,
            &t(&[1, 3, 4, 8], f),
            None,
        ),
        "shape",
    );
    assert_err(
        "cache shapes",
        attention_cached_into(
            client,
            &q,
            &kc,
            &t(&[9, 2, 8], f),
            KvLen::Host(4),
            0.3,
            &out,
            None,
        ),
        "shape",
    );

    // A workspace too small for the split partials of a long cache (4000 keys are always split).
    let small = AttentionWorkspace::new(client, 1, 8);
    let long_k = t(&[4000, 2, 8], f);
    assert_err(
        "workspace",
        attention_cached_into(
            client,
            &q,
            &long_k,
            &long_k,
            KvLen::Host(4000),
            0.3,
            &out,
            Some(&small),
        ),
        "argument",
    );

    // The cache write.
    let nk = t(&[2, 2, 8], f);
    assert!(kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Host(8)).is_ok());
    assert_err(
        "write overflow",
        kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Host(9)),
        "argument",
    );
    assert_err(
        "write huge start",
        kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Host(usize::MAX)),
        "argument",
    );
    assert_err(
        "write row shape",
        kv_cache_write_into(
            client,
            &t(&[2, 2, 4], f),
            &t(&[2, 2, 4], f),
            &kc,
            &vc,
            KvLen::Host(0),
        ),
        "shape",
    );
    assert_err(
        "write k/v differ",
        kv_cache_write_into(client, &nk, &t(&[3, 2, 8], f), &kc, &vc, KvLen::Host(0)),
        "shape",
    );
    assert_err(
        "write dtype",
        kv_cache_write_into(
            client,
            &t(&[2, 2, 8], DType::F16),
            &t(&[2, 2, 8], DType::F16),
            &kc,
            &vc,
            KvLen::Host(0),
        ),
        "dtype",
    );
    assert_err(
        "write start dtype",
        kv_cache_write_into(client, &nk, &nk, &kc, &vc, KvLen::Device(&len_i32)),
        "dtype",
    );
    assert_err(
        "write rank",
        kv_cache_write_into(
            client,
            &t(&[2, 16], f),
            &t(&[2, 16], f),
            &kc,
            &vc,
            KvLen::Host(0),
        ),
        "shape",
    );
}

#[test]
fn attention_rejects_bad_inputs() {
    on_each_runtime!(attention_errors_case);
}
