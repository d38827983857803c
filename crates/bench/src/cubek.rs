//! The cubek-matmul peer (CubeCL's own matmul library, 0.3.0-pre.3) on the prefill GEMM cases of
//! the `matmul` family: the same shapes and case names with the strategy appended, so that a
//! table can put cubek beside our tensor-core GEMM and cuBLAS from the same run.
//!
//! `y[M, N] = x[M, K] · w[N, K]ᵀ`: w goes in as a `[K, N]` view with strides `[1, K]` (no copy),
//! which cubek accepts as a column-major right-hand side.

use cubecl::prelude::*;
use cubek_matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek_matmul::multi_level::Strategy as MlStrategy;
use cubek_matmul::strategy::Strategy;
use cubek_std::InputBinding;
use ops::{caps, DType, DeviceTensor};

use super::matmul::MODEL_SHAPES;
use super::Case;

/// The strategies timed: cubek's default (what `Strategy::Auto` picks) and its pipelined
/// mma.sync / TMA kernels.
fn strategies() -> Vec<(&'static str, Strategy)> {
    vec![
        ("auto", Strategy::Auto),
        (
            "double_cyclic_mma",
            MlStrategy::DoubleCyclicMma(Default::default()).into(),
        ),
        (
            "specialized_tma_mma",
            MlStrategy::SpecializedTmaMma(Default::default()).into(),
        ),
        (
            "ordered_double_mma",
            MlStrategy::OrderedDoubleMma(Default::default()).into(),
        ),
    ]
}

fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    strategy: &Strategy,
    x: &DeviceTensor<R>,
    w_t: &DeviceTensor<R>,
    y: &DeviceTensor<R>,
) -> Result<(), String> {
    let elem = x.dtype().elem_type();
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: elem,
        rhs: elem,
        out: elem,
    });
    cubek_matmul::launch::launch_ref(
        strategy,
        client,
        InputBinding::new(x.tensor_handle().clone().binding(), elem),
        InputBinding::new(w_t.tensor_handle().clone().binding(), elem),
        y.tensor_handle().clone().binding(),
        &mut dtypes,
    )
    .map_err(|e| format!("{e:?}"))
}

pub fn cases<R: Runtime>(client: &ComputeClient<R>) -> Vec<Case<'_>> {
    let mut out = Vec::new();
    let mut shapes: Vec<(String, usize, usize, usize)> = [512usize, 4096]
        .iter()
        .map(|&m| (format!("gemm {m}x4096x4096"), m, 4096, 4096))
        .collect();
    for (name, k, n) in MODEL_SHAPES {
        shapes.push((format!("gemm {name} 512x{k}x{n}"), 512, k, n));
    }
    for dtype in [DType::BF16, DType::F16] {
        if !caps::supports_dtype(client, dtype) {
            continue;
        }
        let e = dtype.size() as f64;
        for (name, m, k, n) in &shapes {
            let (m, k, n) = (*m, *k, *n);
            let x = super::matmul::filled(client, &[m, k], dtype);
            let w = super::matmul::filled(client, &[n, k], dtype);
            let w_t = w.view(&[k, n], &[1, k]).unwrap();
            let y = DeviceTensor::empty(client, &[m, n], dtype);
            // Our result, to check each strategy once before timing it.
            let expect = ops::matmul::linear(client, &x, &w, None, None)
                .unwrap()
                .to_f32_vec(client)
                .unwrap();
            for (sname, strategy) in strategies() {
                if let Err(e) = launch(client, &strategy, &x, &w_t, &y) {
                    eprintln!("cubek {sname} {name} {dtype:?}: unavailable ({e})");
                    continue;
                }
                let got = y.to_f32_vec(client).unwrap();
                let worst = got
                    .iter()
                    .zip(&expect)
                    .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
                    .fold(0f32, f32::max);
                if !worst.is_finite() || worst > 0.05 {
                    eprintln!("cubek {sname} {name} {dtype:?}: differs from ours (worst {worst}); not timed");
                    continue;
                }
                let (x, w_t, y) = (x.clone(), w_t.clone(), y.clone());
                out.push(Case {
                    name: format!("{name} cubek:{sname}"),
                    dtype,
                    bytes: e * (m * k + n * k + m * n) as f64,
                    flops: 2.0 * (m * n * k) as f64,
                    run: Box::new(move || launch(client, &strategy, &x, &w_t, &y).unwrap()),
                });
            }
        }
    }
    out
}
