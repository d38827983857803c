//! Attention over whole K/V tensors: the grid on the automatic choice, each kernel forced.

use super::*;

/// The grid: every runtime runs a covering subset (lavapipe is a CPU); CUDA runs the full
/// cross product of Lq x Lk x heads x D x causal (Lq <= Lk when causal) in every dtype.
fn attention_grid_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(40);
    let shapes: Vec<Shape> = if is_cuda(client) {
        let mut v = Vec::new();
        for &lq in &[1usize, 2, 17, 128, 129] {
            for &lk in &[1usize, 17, 128, 1000, 4097] {
                for &(hq, hkv) in &[(1usize, 1usize), (4, 2), (12, 2), (14, 2)] {
                    for &d in &[64usize, 128] {
                        for causal in [false, true] {
                            if !(causal && lq > lk) {
                                v.push(Shape::new(lq, lk, hq, hkv, d, causal));
                            }
                        }
                    }
                }
            }
        }
        v
    } else {
        vec![
            Shape::new(1, 1, 1, 1, 64, false),
            Shape::new(1, 1000, 12, 2, 128, true),
            Shape::new(2, 17, 4, 2, 64, true),
            Shape::new(2, 4097, 4, 2, 64, false),
            Shape::new(17, 128, 14, 2, 128, true),
            Shape::new(128, 128, 4, 2, 64, true),
            Shape::new(129, 17, 1, 1, 128, false),
            Shape::new(17, 1000, 12, 2, 64, false),
        ]
    };
    let start = std::time::Instant::now();
    for (n, s) in shapes.iter().enumerate() {
        let x = inputs(&mut rng, s);
        for dtype in float_dtypes(client) {
            // On CUDA the production dtype (bf16) covers the whole grid, the others a third.
            if is_cuda(client) && dtype != DType::BF16 && n % 3 != 0 {
                continue;
            }
            check(client, s, &x, dtype, AttentionStrategy::Auto);
        }
        if n % 100 == 99 {
            eprintln!("attention grid: {} shapes in {:?}", n + 1, start.elapsed());
        }
    }
}

/// Each kernel on its own (where the runtime has it), on shapes that are awkward for its tiles:
/// the tiled kernel also with a head dim that is no multiple of 8 and with a batch.
fn attention_kernels_case<R: Runtime>(client: &ComputeClient<R>) {
    let mut rng = rng(41);
    // A negative scale is legal; the tensor-core kernels keep maxima in raw score units and
    // leave it to the tiled kernel.
    let neg = Shape::new(20, 31, 4, 2, 64, true);
    let mut x = inputs(&mut rng, &neg);
    x.scale = -x.scale;
    let f = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
    x.want = reference::attention::attention(
        &f(&x.q),
        &f(&x.k),
        &f(&x.v),
        neg.lq,
        neg.lk,
        neg.hq,
        neg.hkv,
        neg.d,
        x.scale as f64,
        true,
    );
    for dtype in float_dtypes(client) {
        check(client, &neg, &x, dtype, AttentionStrategy::Auto);
    }
    let mut batched = Shape::new(19, 33, 4, 2, 64, true);
    batched.batch = 3;
    let shapes = [
        Shape::new(3, 40, 14, 2, 40, true),
        Shape::new(20, 31, 4, 2, 64, false),
        Shape::new(1, 300, 12, 2, 128, false),
        Shape::new(5, 77, 4, 2, 64, true),
        Shape::new(33, 65, 12, 2, 128, true),
        Shape::new(70, 70, 1, 1, 64, false),
        batched,
    ];
    for s in &shapes {
        let x = inputs(&mut rng, s);
        for dtype in float_dtypes(client) {
            check(client, s, &x, dtype, AttentionStrategy::Tiled);
            for strategy in forced_strategies() {
                let (q, _) = upload(client, &x.q, &s.q_shape(), dtype);
                let (k, _) = upload(client, &x.k, &s.k_shape(), dtype);
                let out = poisoned(client, &s.q_shape(), dtype);
                match attention_into_with(client, &q, &k, &k, x.scale, s.causal, &out, strategy) {
                    Ok(()) => check(client, s, &x, dtype, strategy),
                    Err(e) => assert_eq!(e.kind(), "feature", "{strategy:?}: {e}"),
                }
            }
        }
    }
}

#[test]
fn attention_matches_reference() {
    on_each_runtime!(attention_grid_case);
}

#[test]
fn attention_each_kernel_matches_reference() {
    on_each_runtime!(attention_kernels_case);
}
