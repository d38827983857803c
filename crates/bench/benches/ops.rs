//! Criterion benchmarks of every kernel family, on every runtime present (CUDA first).
//!
//! The cases are the ones `cubellm bench` prints (`bench::<family>::cases`); criterion
//! times `iters` back-to-back launches followed by one device sync. Filter as usual:
//! `cargo bench -p cubellm-bench -- norm/`.

use std::time::Instant;

use bench::{cases, sync, FAMILIES};
use criterion::{criterion_group, criterion_main, Criterion};
use cubecl::prelude::*;

fn bench_runtime<R: Runtime>(c: &mut Criterion, client: &ComputeClient<R>) {
    for family in FAMILIES {
        let mut group = c.benchmark_group(format!("{family}/{}", R::name(client)));
        for mut case in cases(client, family) {
            let id = format!("{} {}", case.name, case.dtype);
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    sync(client);
                    let start = Instant::now();
                    for _ in 0..iters {
                        (case.run)();
                    }
                    sync(client);
                    start.elapsed()
                })
            });
        }
        group.finish();
    }
}

fn all(c: &mut Criterion) {
    let backends = runtime::available();
    assert!(
        !backends.is_empty(),
        "no runtime with a device to benchmark on"
    );
    for backend in backends {
        runtime::with_runtime!(backend, |client: R| bench_runtime::<R>(c, &client));
    }
}

criterion_group!(benches, all);
criterion_main!(benches);
