use cubecl::prelude::*;
use ops::gemm::{dequant_epilogue, DequantBlueprint, EpilogueBlueprint};
use ops::matmul::{
    fused_gated_mlp, fused_gated_mlp_into, fused_gated_mlp_into_with, linear, linear_into,
    linear_into_with, plan, Activation, CmmaTile, FusedGatedMlp, GatedMlpWeights, GatedWeights,
    Kernel, MatmulStrategy,
};
use ops::reference::matmul as reference;
use ops::{DType, DeviceTensor};
use rand::rngs::StdRng;
use testkit::*;
use MatmulStrategy::TensorCore;

/// The operands of a linear that may also be read as a gated MLP's: the weight `[2n, k]`, the
/// bias `[2n]` and the residual `[m, 2n]`, uniform in ±1 and drawn in that order, each uploaded
/// as `dtype` beside its values as the device holds them.
pub(crate) fn linear_operands<R: Runtime>(
    client: &ComputeClient<R>,
    rng: &mut StdRng,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
) -> [(DeviceTensor<R>, Vec<f64>); 3] {
    [
        upload(client, &random(rng, 2 * n * k, 1.0), &[2 * n, k], dtype),
        upload(client, &random(rng, 2 * n, 1.0), &[2 * n], dtype),
        upload(client, &random(rng, 2 * m * n, 1.0), &[m, 2 * n], dtype),
    ]
}

fn on_cuda<R: Runtime>(client: &ComputeClient<R>) -> bool {
    ops::caps::runtime_name(client) == "cuda"
}

/// (M, N, K): decode and prefill M, N and K off every tile size; the large ones on CUDA only
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
            let what = format!(
                "linear {dtype} {m}x{n}x{k} ({:?})",
                plan(client, m, k, dtype)
            );
            // Every epilogue on a GEMV and a GEMM shape; one per other shape: each combination
            // is a kernel compile (slow on lavapipe, and the pipelined CUDA kernels are long
            // compiles too), and the forced-tile tests cover the epilogues on many shapes.
            let all = [(false, false), (true, false), (false, true), (true, true)];
            let epilogues = if si == 0 || si == 6 {
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
                    plan(client, m, k, dtype)
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
    assert_eq!(plan(client, 1, 64, DType::F32), Kernel::Gemv);
    assert_eq!(plan(client, 16, 64, DType::F32), Kernel::Gemv);
    assert_ne!(plan(client, 17, 64, DType::F32), Kernel::Gemv);
}

/// The pipeline configurations the forced-tile tests run: the defaults, a deeper pipeline with
/// BK = 64, one-plane tiles with the deepest pipeline, and the register-staged path (stages 0).
/// (Each is a separate CUDA compile per epilogue and copy width: kept short.)
const FORCED_TILES: [CmmaTile; 7] = [
    CmmaTile::LARGE,
    CmmaTile::LARGE_DEEP,
    CmmaTile::LARGE_GATED,
    CmmaTile::SMALL,
    CmmaTile::new(128, 128, 2, 2, 4).with_bk(64),
    CmmaTile::new(16, 32, 1, 1, 8),
    CmmaTile::new(64, 128, 2, 4, 0),
];

/// (M, N, K) crossing tile and stage boundaries: K = 1000 and 200 end mid-step (16-byte
/// copies), 72 has fewer steps than the deepest pipelines' prologue, 1536 walks many barrier
/// phases, 36 and 34 give 8- and 4-byte copies, 127 (odd) runs the register path whatever the
/// tile asks for.
const FORCED_SHAPES: [(usize, usize, usize); 7] = [
    (17, 33, 127),
    (64, 127, 1000),
    (129, 1000, 200),
    (512, 130, 72),
    (33, 64, 36),
    (65, 48, 34),
    (129, 96, 1536),
];

/// Whether the forced-tile tests can run here; says why not once per runtime.
fn tensor_cores<R: Runtime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    let tile = CmmaTile::LARGE;
    let x = DeviceTensor::from_f32(client, &[0.5; 8 * 16], &[8, 16], dtype).unwrap();
    let w = DeviceTensor::from_f32(client, &[0.5; 4 * 16], &[4, 16], dtype).unwrap();
    let out = DeviceTensor::empty(client, &[8, 4], dtype);
    match linear_into_with(client, &x, &w, None, None, &out, TensorCore(tile)) {
        Ok(()) => true,
        Err(e) => {
            assert_eq!(e.kind(), "feature", "{e}");
            assert_ne!(plan(client, 17, 16, dtype), Kernel::TensorCore);
            eprintln!(
                "forced tensor-core tiles skipped on {}: {e}",
                ops::caps::runtime_name(client)
            );
            false
        }
    }
}

/// The half-precision dtypes with tensor cores here, or none (the tests then skip).
fn tensor_core_dtypes<R: Runtime>(client: &ComputeClient<R>) -> Vec<DType> {
    let dtypes: Vec<DType> = [DType::F16, DType::BF16]
        .into_iter()
        .filter(|&d| ops::caps::supports_dtype(client, d))
        .collect();
    match dtypes.first() {
        Some(&d) if tensor_cores(client, d) => dtypes,
        _ => Vec::new(),
    }
}

fn forced_linear_case<R: Runtime>(client: &ComputeClient<R>) {
    let dtypes = tensor_core_dtypes(client);
    if dtypes.is_empty() {
        return;
    }
    let mut rng = rng(73);
    for (ti, tile) in FORCED_TILES.into_iter().enumerate() {
        for (si, (m, n, k)) in FORCED_SHAPES.into_iter().enumerate() {
            let dtype = dtypes[(ti + si) % dtypes.len()];
            let (x, xh) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let (w, wh) = upload(client, &random(&mut rng, n * k, 1.0), &[n, k], dtype);
            let (b, bh) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
            let (r, rh) = upload(client, &random(&mut rng, m * n, 1.0), &[m, n], dtype);
            // Each shape with one epilogue, rotating so that every tile meets all four.
            let (bias, res) =
                [(true, true), (false, false), (true, false), (false, true)][(ti + si) % 4];
            let out = poisoned(client, &[m, n], dtype);
            linear_into_with(
                client,
                &x,
                &w,
                bias.then_some(&b),
                res.then_some(&r),
                &out,
                TensorCore(tile),
            )
            .unwrap();
            let want = reference::linear(
                &xh,
                &wh,
                bias.then_some(&bh[..]),
                res.then_some(&rh[..]),
                (m, n, k),
            );
            assert_close(
                &format!("linear {tile:?} {dtype} {m}x{n}x{k} bias={bias} res={res}"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                tol(dtype),
            );
        }
    }
}

fn forced_gated_case<R: Runtime>(client: &ComputeClient<R>) {
    let dtypes = tensor_core_dtypes(client);
    if dtypes.is_empty() {
        return;
    }
    let mut rng = rng(74);
    for (ti, tile) in FORCED_TILES.into_iter().enumerate() {
        for (si, (m, i, k)) in FORCED_SHAPES.into_iter().enumerate() {
            let dtype = dtypes[(ti + si + 1) % dtypes.len()];
            let (x, xh) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let (gu, guh) = upload(
                client,
                &random(&mut rng, 2 * i * k, 1.0),
                &[2 * i, k],
                dtype,
            );
            let act = [Activation::Silu, Activation::Gelu][(ti + si) % 2];
            let concatenated = (ti + si / 2) % 2 == 0;
            let want = reference::gated_mlp(
                &xh,
                &guh[..i * k],
                &guh[i * k..],
                act == Activation::Gelu,
                (m, i, k),
            );
            let out = poisoned(client, &[m, i], dtype);
            let (gate, up);
            let weights = if concatenated {
                GatedWeights::Concatenated(&gu)
            } else {
                gate = upload_f64(client, &guh[..i * k], &[i, k], dtype);
                up = upload_f64(client, &guh[i * k..], &[i, k], dtype);
                GatedWeights::Separate {
                    gate: &gate,
                    up: &up,
                }
            };
            fused_gated_mlp_into_with(client, &x, weights, act, &out, TensorCore(tile)).unwrap();
            assert_close(
                &format!("gated {act:?} {tile:?} {dtype} {m}x{i}x{k} concatenated={concatenated}"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                2.0 * tol(dtype),
            );
        }
    }
}

fn forced_errors_case<R: Runtime>(client: &ComputeClient<R>) {
    let dtype = DType::F16;
    if !ops::caps::supports_dtype(client, dtype) {
        return;
    }
    let x = DeviceTensor::from_f32(client, &[0.5; 32 * 64], &[32, 64], dtype).unwrap();
    let w = DeviceTensor::from_f32(client, &[0.5; 64 * 64], &[64, 64], dtype).unwrap();
    let out = DeviceTensor::empty(client, &[32, 64], dtype);
    let half = DeviceTensor::empty(client, &[32, 32], dtype);
    let bad = CmmaTile::new(100, 128, 2, 4, 3);
    // A tile with one B fragment per plane cannot split it into gate and up.
    let odd = CmmaTile::new(64, 64, 2, 4, 3);
    let gated = |tile| {
        fused_gated_mlp_into_with(
            client,
            &x,
            GatedWeights::Concatenated(&w),
            Activation::Silu,
            &half,
            TensorCore(tile),
        )
    };
    if tensor_core_dtypes(client).is_empty() {
        assert_err(
            "forced tile without cmma",
            linear_into_with(
                client,
                &x,
                &w,
                None,
                None,
                &out,
                TensorCore(CmmaTile::LARGE),
            ),
            "feature",
        );
        return;
    }
    assert_err(
        "invalid tile",
        linear_into_with(client, &x, &w, None, None, &out, TensorCore(bad)),
        "argument",
    );
    assert!(linear_into_with(client, &x, &w, None, None, &out, TensorCore(odd)).is_ok());
    assert_err("odd gated tile", gated(odd), "argument");
    assert!(gated(CmmaTile::SMALL).is_ok());
    let f32x = DeviceTensor::from_f32(client, &[0.5; 32 * 64], &[32, 64], DType::F32).unwrap();
    let f32w = DeviceTensor::from_f32(client, &[0.5; 64 * 64], &[64, 64], DType::F32).unwrap();
    let f32o = DeviceTensor::empty(client, &[32, 64], DType::F32);
    assert_err(
        "forced tile on f32",
        linear_into_with(
            client,
            &f32x,
            &f32w,
            None,
            None,
            &f32o,
            TensorCore(CmmaTile::LARGE),
        ),
        "feature",
    );
}

/// The tiled GEMM forced onto a GEMV shape (M = 3) and the GEMV forced (the strategy's
/// plumbing), each with every epilogue and both gates, on sizes off every tile and vector width;
/// the GEMV refuses a 17th row.
fn forced_portable_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(75);
    let all = [(false, false), (true, false), (false, true), (true, true)];
    for dtype in float_dtypes(client) {
        for (strategy, (m, n, k)) in [
            (MatmulStrategy::Tiled, (3, 70, 33)),
            (MatmulStrategy::Gemv, (3, 37, 72)),
            // K split over several planes per column: K not a multiple of the split's reach,
            // N off the columns per cube, M = 1 and 16.
            (MatmulStrategy::GemvSplit(2), (1, 37, 72)),
            (MatmulStrategy::GemvSplit(8), (16, 5, 1000)),
            (MatmulStrategy::GemvSplit(4), (3, 11, 4106)),
        ] {
            let (x, xh) = upload(client, &random(&mut rng, m * k, 1.0), &[m, k], dtype);
            let [(w, wh), (b, bh), (r, rh)] = linear_operands(client, &mut rng, (m, n, k), dtype);
            let what = format!("{strategy:?} {dtype} {m}x{n}x{k}");
            for (bias, res) in all {
                let out = poisoned(client, &[m, 2 * n], dtype);
                linear_into_with(
                    client,
                    &x,
                    &w,
                    bias.then_some(&b),
                    res.then_some(&r),
                    &out,
                    strategy,
                )
                .unwrap();
                let want = reference::linear(
                    &xh,
                    &wh,
                    bias.then_some(&bh[..]),
                    res.then_some(&rh[..]),
                    (m, 2 * n, k),
                );
                assert_close(
                    &format!("linear {what} bias={bias} res={res}"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    tol(dtype),
                );
            }
            for act in [Activation::Silu, Activation::Gelu] {
                let out = poisoned(client, &[m, n], dtype);
                fused_gated_mlp_into_with(
                    client,
                    &x,
                    GatedWeights::Concatenated(&w),
                    act,
                    &out,
                    strategy,
                )
                .unwrap();
                let want = reference::gated_mlp(
                    &xh,
                    &wh[..n * k],
                    &wh[n * k..],
                    act == Activation::Gelu,
                    (m, n, k),
                );
                assert_close(
                    &format!("gated {act:?} {what}"),
                    &out.to_f64_vec(client).unwrap(),
                    &want,
                    2.0 * tol(dtype),
                );
            }
        }
    }
    let f = |shape: &[usize]| {
        DeviceTensor::from_f32(
            client,
            &vec![0.5; shape.iter().product()],
            shape,
            DType::F32,
        )
        .unwrap()
    };
    let (x, w, out) = (f(&[17, 8]), f(&[5, 8]), f(&[17, 5]));
    assert_err(
        "forced GEMV above 16 rows",
        linear_into_with(client, &x, &w, None, None, &out, MatmulStrategy::Gemv),
        "argument",
    );
    let (x1, out1) = (f(&[1, 8]), f(&[1, 5]));
    assert_err(
        "a K split of 3 groups",
        linear_into_with(
            client,
            &x1,
            &w,
            None,
            None,
            &out1,
            MatmulStrategy::GemvSplit(3),
        ),
        "argument",
    );
    linear_into_with(client, &x, &w, None, None, &out, MatmulStrategy::Tiled).unwrap();
}

/// [`dequant_epilogue`] on every element of an `[m, n]` grid of accumulators (the 8-bit GEMMs'
/// epilogue, which no kernel of this crate uses).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn dequant_epilogue_kernel<F: Float>(
    acc: &[f32],
    sa: &[f32],
    sb: &[f32],
    bias: &[F],
    residual: &[F],
    out: &mut [F],
    m: usize,
    n: usize,
    #[comptime] bp: DequantBlueprint,
    #[define(F)] _dtype: ElemType,
) {
    let i = ABSOLUTE_POS;
    if i < m * n {
        out[i] = dequant_epilogue::<F>(acc[i], i / n, i % n, n, sa, sb, bias, residual, bp);
    }
}

/// Every combination of scalar or per-row / per-column scales, bias and residual, on a grid off
/// every power of two.
fn dequant_epilogue_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(76);
    let (m, n) = (3usize, 37usize);
    for dtype in float_dtypes(client) {
        let acc = random(&mut rng, m * n, 100.0);
        let (sa, sb) = (random(&mut rng, m, 0.1), random(&mut rng, n, 0.1));
        let f32s = |v: &[f32]| DeviceTensor::from_f32(client, v, &[v.len()], DType::F32).unwrap();
        let (acc_t, sa_t, sb_t) = (f32s(&acc), f32s(&sa), f32s(&sb));
        let (b, bh) = upload(client, &random(&mut rng, n, 1.0), &[n], dtype);
        let (r, rh) = upload(client, &random(&mut rng, m * n, 1.0), &[m, n], dtype);
        for combo in 0..16 {
            let [sa_scalar, sb_scalar, has_bias, has_residual] =
                [1, 2, 4, 8].map(|b| combo & b != 0);
            let bp = DequantBlueprint {
                sa_scalar,
                sb_scalar,
                epilogue: EpilogueBlueprint::linear(has_bias, has_residual),
            };
            let out = poisoned(client, &[m, n], dtype);
            unsafe {
                dequant_epilogue_kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static((m * n).div_ceil(64) as u32, 1, 1),
                    CubeDim::new_1d(64),
                    acc_t.as_buffer_arg(),
                    sa_t.as_buffer_arg(),
                    sb_t.as_buffer_arg(),
                    b.as_buffer_arg(),
                    r.as_buffer_arg(),
                    out.as_buffer_arg(),
                    m,
                    n,
                    bp,
                    dtype.elem_type(),
                );
            }
            let want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (row, col) = (i / n, i % n);
                    let a = sa[if sa_scalar { 0 } else { row }] as f64;
                    let s = sb[if sb_scalar { 0 } else { col }] as f64;
                    let mut y = acc[i] as f64 * a * s;
                    if has_bias {
                        y += bh[col];
                    }
                    if has_residual {
                        y += rh[i];
                    }
                    y
                })
                .collect();
            assert_close(
                &format!("dequant epilogue {dtype} {bp:?}"),
                &out.to_f64_vec(client).unwrap(),
                &want,
                tol(dtype),
            );
        }
    }
}

#[test]
fn matmul_forced_portable_kernels_match_reference() {
    on_each_runtime!(forced_portable_case);
}

#[test]
fn matmul_dequant_epilogue_matches_reference() {
    on_each_runtime!(dequant_epilogue_case);
}

#[test]
fn linear_forced_tiles_match_reference() {
    on_each_runtime!(forced_linear_case);
}

#[test]
fn fused_gated_mlp_forced_tiles_match_reference() {
    on_each_runtime!(forced_gated_case);
}

#[test]
fn matmul_forced_tiles_reject_bad_tiles() {
    on_each_runtime!(forced_errors_case);
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
