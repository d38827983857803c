//! Timing of device work, shared by the criterion benches and `cli bench`.
//!
//! A sample launches the op `iters` times back to back and waits for the device once, so the
//! time per launch includes the host's launch overhead exactly as a real decode loop pays it;
//! the median of several samples after a warm-up is reported. Results print as JSON lines so
//! that `scripts/bench_table.py` can put them beside PyTorch's numbers from the same machine.

use std::time::{Duration, Instant};

use cubecl::prelude::*;

/// One measured case.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// Kernel family (`norm`, `rope`, `matmul`, ...).
    pub family: &'static str,
    /// Case name, unique within the family, the same string the PyTorch script uses.
    pub case: String,
    pub dtype: String,
    pub runtime: &'static str,
    /// Median time of one launch.
    pub median: Duration,
    /// Bytes the op must move at least (reads + writes), for GB/s.
    pub bytes: f64,
    /// Floating-point operations, for TFLOP/s (0 when not meaningful).
    pub flops: f64,
}

impl BenchResult {
    pub fn gbps(&self) -> f64 {
        self.bytes / self.median.as_secs_f64() / 1e9
    }

    pub fn tflops(&self) -> f64 {
        self.flops / self.median.as_secs_f64() / 1e12
    }

    /// One JSON line (no serde dependency needed for this flat record).
    pub fn to_json(&self) -> String {
        format!(
            "{{\"impl\":\"cubellm\",\"family\":\"{}\",\"case\":\"{}\",\"dtype\":\"{}\",\"runtime\":\"{}\",\"us\":{:.3},\"bytes\":{},\"flops\":{},\"gbps\":{:.1},\"tflops\":{:.2}}}",
            self.family,
            self.case,
            self.dtype,
            self.runtime,
            self.median.as_secs_f64() * 1e6,
            self.bytes,
            self.flops,
            self.gbps(),
            self.tflops()
        )
    }
}

/// Blocks until the device has finished everything queued.
pub fn sync<R: Runtime>(client: &ComputeClient<R>) {
    cubecl::future::block_on(client.sync()).expect("device sync failed");
}

/// Median time of one call of `launch`, measured as described in the module docs.
///
/// `launch` must only queue work (no reads); `iters` launches form one sample.
pub fn time_launches<R: Runtime>(
    client: &ComputeClient<R>,
    samples: usize,
    iters: usize,
    mut launch: impl FnMut(),
) -> Duration {
    // Warm-up: compiles the kernel and settles clocks and the allocator.
    for _ in 0..iters.clamp(3, 20) {
        launch();
    }
    sync(client);
    let mut times: Vec<Duration> = (0..samples.max(1))
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                launch();
            }
            sync(client);
            start.elapsed() / iters as u32
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Picks a launch count so that one sample takes about `target` (at least 3 launches).
pub fn calibrate<R: Runtime>(
    client: &ComputeClient<R>,
    target: Duration,
    mut launch: impl FnMut(),
) -> usize {
    launch();
    sync(client);
    let start = Instant::now();
    launch();
    sync(client);
    let one = start.elapsed().max(Duration::from_nanos(500));
    ((target.as_secs_f64() / one.as_secs_f64()) as usize).clamp(3, 10_000)
}

/// A benchmark case: a closure that queues one launch of the op on prepared device buffers.
pub struct Case<'a> {
    pub name: String,
    pub dtype: ops::DType,
    pub bytes: f64,
    pub flops: f64,
    pub run: Box<dyn FnMut() + 'a>,
}

/// Times every case whose name contains `filter`, printing a JSON line for each.
pub fn measure<R: Runtime>(
    client: &ComputeClient<R>,
    family: &'static str,
    cases: Vec<Case<'_>>,
    filter: &str,
) -> Vec<BenchResult> {
    let mut results = Vec::new();
    for mut case in cases {
        if !case.name.contains(filter) {
            continue;
        }
        let iters = calibrate(client, Duration::from_millis(20), &mut case.run);
        let median = time_launches(client, 9, iters, &mut case.run);
        let r = BenchResult {
            family,
            case: case.name,
            dtype: case.dtype.name().to_string(),
            runtime: R::name(client),
            median,
            bytes: case.bytes,
            flops: case.flops,
        };
        println!("{}", r.to_json());
        results.push(r);
    }
    results
}

/// The families `cli bench` and the criterion benches know, by name.
pub const FAMILIES: &[&str] = &[
    "norm",
    "core",
    "matmul",
    "attention",
    "sparse",
    "quant",
    "cubek",
];

/// The cases of one family on the runtime behind `client`.
pub fn cases<'a, R: Runtime>(client: &'a ComputeClient<R>, family: &str) -> Vec<Case<'a>> {
    match family {
        "norm" => norm::cases(client),
        "core" => core::cases(client),
        "matmul" => matmul::cases(client),
        "attention" => attention::cases(client),
        "sparse" => sparse::cases(client),
        "quant" => quant::cases(client),
        "cubek" => cubek::cases(client),
        _ => Vec::new(),
    }
}

pub mod attention;
pub mod core;
pub mod cubek;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod sparse;
