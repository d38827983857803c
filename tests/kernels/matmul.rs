use crate::harness::*;
use crate::on_each_runtime;
use cubecl::prelude::*;
use ops::matmul::{
    fused_gated_mlp, fused_gated_mlp_into, linear, linear_into, plan, Activation, FusedGatedMlp,
    GatedMlpWeights, GatedWeights, Kernel,
};
use ops::reference::matmul as reference;
use ops::{DType, DeviceTensor};

fn on_cuda<R: Runtime>(client: &ComputeClient<R>) -> bool {
    ops::caps::runtime_name(client) == "cuda"
}

/// (M, N, K): every M of the issue, N and K off every tile size; the large ones on CUDA only
/// (lavapipe runs them on the CPU).
fn shapes<R: Runtime>(client: &ComputeClient<R>) -> Vec<(usize, usize, usize)> {
    let mut s = vec![
        (1, 33, 127),
        (2, 127, 33),
        (3, 1000, 64),
        (16, 130, 1536),
        (17, 127, 1000),
        (64, 33, 200),
        (129, 100, 127),
        (512, 64, 72),
    ];
    if on_cuda(client) {
        s.extend([
            (1, 1536, 8960),
            (16, 8960, 1536),
            (64, 1000, 1536),
            (129, 1536, 1536),
            (512, 1536, 1000),
            (512, 2048, 1536),
        ]);
    }
    s
}

fn tol(dtype: DType) -> f64 {
    // f32 accumulation over K, then one rounding to the dtype.
    match dtype {
        DType::F32 => 2e-5,
        d => tolerance(d),
    }
}

fn linear_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(71);
    for dtype in float_dtypes(client) {
        for (si, (m, n, k)) in shapes(client).into_iter().enumerate() {
            let (x, xh) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let (w, wh) = upload(client, &random(&mut rng, n * k, 1.0), &[n, k], dtype);
            let (b, bh) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
            let (r, rh) = upload(client, &random(&mut rng, m * n, 1.0), &[m, n], dtype);
            let what = format!("linear {dtype} {m}x{n}x{k} ({:?})", plan(client, m, dtype));
            // Every epilogue on a GEMV and a GEMM shape; one per other shape (each combination
            // is a kernel compile, which lavapipe makes slow).
            let all = [(false, false), (true, false), (false, true), (true, true)];
            let epilogues = if si == 0 || si == 6 || on_cuda(client) {
                &all[..]
            } else {
                &all[si % 4..si % 4 + 1]
            };
            for &(bias, res) in epilogues {
                let out = poisoned(client, &[m, n], dtype);
                linear_into(client, &x, &w, bias.then_some(&b), res.then_some(&r), &out).unwrap();
                let want = reference::linear(
                    &xh,
                    &wh,
                    bias.then_some(&bh[..]),
                    res.then_some(&rh[..]),
                    (m, n, k),
                );
                assert_close(
                    &format!("{what} bias={bias} res={res}"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    tol(dtype),
                );
            }
        }
        // Leading dims are flattened: [2, 3, K] -> [2, 3, N].
        let (x, xh) = upload(client, &random(&mut rng, 6 * 40, 1.0), &[2, 3, 40], dtype);
        let (w, wh) = upload(client, &random(&mut rng, 24 * 40, 1.0), &[24, 40], dtype);
        let y = linear(client, &x, &w, None, None).unwrap();
        assert_eq!(y.shape(), &[2, 3, 24]);
        assert_close(
            "linear batched",
            &y.to_f64_vec(client).unwrap(),
            &reference::linear(&xh, &wh, None, None, (6, 24, 40)),
            tol(dtype),
        );
    }
}

fn gated_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(72);
    for dtype in float_dtypes(client) {
        let mut cases = vec![
            (1usize, 96usize, 64usize),
            (3, 33, 127),
            (17, 100, 40),
            (129, 70, 96),
        ];
        if on_cuda(client) {
            cases.extend([(1, 8960, 1536), (512, 1000, 1536)]);
        }
        for (m, i, k) in cases {
            let (x, xh) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let (gu, guh) = upload(
                client,
                &random(&mut rng, 2 * i * k, 1.0),
                &[2 * i, k],
                dtype,
            );
            let gate = upload_f64(client, &guh[..i * k], &[i, k], dtype);
            let up = upload_f64(client, &guh[i * k..], &[i, k], dtype);
            for act in [Activation::Silu, Activation::Gelu] {
                let want = reference::gated_mlp(
                    &xh,
                    &guh[..i * k],
                    &guh[i * k..],
                    act == Activation::Gelu,
                    (m, i, k),
                );
                let what = format!(
                    "gated {act:?} {dtype} {m}x{i}x{k} ({:?})",
                    plan(client, m, dtype)
                );
                let out = poisoned(client, &[m, i], dtype);
                fused_gated_mlp_into(client, &x, GatedWeights::Concatenated(&gu), act, &out)
                    .unwrap();
                // Two roundings (the products, then the result).
                assert_close(
                    &format!("{what} concatenated"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    2.0 * tol(dtype),
                );
                let out = fused_gated_mlp(
                    client,
                    &x,
                    GatedWeights::Separate {
                        gate: &gate,
                        up: &up,
                    },
                    act,
                )
                .unwrap();
                assert_close(
                    &format!("{what} separate"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    2.0 * tol(dtype),
                );
            }
        }
        let module = FusedGatedMlp {
            gate_up: GatedMlpWeights::Separate {
                gate: DeviceTensor::from_f32(client, &[0.5; 8], &[2, 4], dtype).unwrap(),
                up: DeviceTensor::from_f32(client, &[0.25; 8], &[2, 4], dtype).unwrap(),
            },
            act: Activation::Silu,
        };
        let x = DeviceTensor::from_f32(client, &[1.0; 4], &[1, 4], dtype).unwrap();
        let y = module
            .forward(client, &x)
            .unwrap()
            .to_f64_vec(client)
            .unwrap();
        let want = reference::silu(2.0) * 1.0;
        assert_close("FusedGatedMlp", &y, &[want, want], 2.0 * tol(dtype));
    }
}

fn errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let f = |shape: &[usize]| {
        DeviceTensor::from_f32(
            client,
            &vec![0.5; shape.iter().product()],
            shape,
            DType::F32,
        )
        .unwrap()
    };
    let (x, w) = (f(&[3, 8]), f(&[5, 8]));
    assert!(linear(client, &x, &w, None, None).is_ok());
    assert_err(
        "K mismatch",
        linear(client, &x, &f(&[5, 7]), None, None),
        "shape",
    );
    assert_err(
        "bias",
        linear(client, &x, &w, Some(&f(&[4])), None),
        "shape",
    );
    assert_err(
        "residual",
        linear(client, &x, &w, None, Some(&f(&[3, 4]))),
        "shape",
    );
    assert_err(
        "out",
        linear_into(client, &x, &w, None, None, &f(&[3, 4])),
        "shape",
    );
    let wh = DeviceTensor::from_f32(client, &[0.5; 40], &[5, 8], DType::F16).unwrap();
    assert_err(
        "dtype mismatch",
        linear(client, &x, &wh, None, None),
        "dtype",
    );
    let strided = f(&[8, 3]).view(&[3, 8], &[1, 3]).unwrap();
    assert_err(
        "strided x",
        linear(client, &strided, &w, None, None),
        "shape",
    );
    let ids = DeviceTensor::from_slice(client, &[1i32; 24], &[3, 8]).unwrap();
    assert_err("int x", linear(client, &ids, &w, None, None), "dtype");
    assert_err(
        "odd concatenated",
        fused_gated_mlp(client, &x, GatedWeights::Concatenated(&w), Activation::Silu),
        "shape",
    );
    assert_err(
        "gate/up mismatch",
        fused_gated_mlp(
            client,
            &x,
            GatedWeights::Separate {
                gate: &w,
                up: &f(&[4, 8]),
            },
            Activation::Silu,
        ),
        "shape",
    );
    if !ops::caps::supports_dtype(client, DType::BF16) {
        let xb = DeviceTensor::from_f32(client, &[0.5; 24], &[3, 8], DType::BF16).unwrap();
        let wb = DeviceTensor::from_f32(client, &[0.5; 40], &[5, 8], DType::BF16).unwrap();
        assert_err(
            "bf16 unsupported",
            linear(client, &xb, &wb, None, None),
            "dtype",
        );
    }
    // The dispatch rule.
    assert_eq!(plan(client, 1, DType::F32), Kernel::Gemv);
    assert_eq!(plan(client, 16, DType::F32), Kernel::Gemv);
    assert_ne!(plan(client, 17, DType::F32), Kernel::Gemv);
}

#[test]
fn linear_matches_reference() {
    on_each_runtime!(linear_case);
}

#[test]
fn fused_gated_mlp_matches_reference() {
    on_each_runtime!(gated_case);
}

#[test]
fn matmul_rejects_bad_inputs() {
    on_each_runtime!(errors_case);
}
