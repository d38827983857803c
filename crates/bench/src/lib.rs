//! Timing of device work, shared by the criterion benches and `cubellm bench`, and the cases of
//! every kernel family (one module per family; `cubek` is the cubek-matmul peer).
//!
//! A sample launches the op `iters` times back to back (about 20 ms, see [`calibrate`]) and waits
//! for the device once, so the time per launch includes the host's launch overhead exactly as a
//! real decode loop pays it; the median of several samples after a warm-up is reported, with the
//! steady-state time of one more launch beside it ([`Timing`]). Results print as JSON lines so
//! that `scripts/bench_table.py` can put them beside PyTorch's numbers from the same machine.

use std::time::{Duration, Instant};

use cubecl::client::Graph;
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
    /// Median time of one launch ([`Timing::median`]).
    pub median: Duration,
    /// Steady-state time of one more launch ([`Timing::steady`]).
    pub steady: Duration,
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
            "{{\"impl\":\"cubellm\",\"family\":\"{}\",\"case\":\"{}\",\"dtype\":\"{}\",\"runtime\":\"{}\",\"us\":{:.3},\"us_steady\":{:.3},\"bytes\":{},\"flops\":{},\"gbps\":{:.1},\"tflops\":{:.2}}}",
            self.family,
            self.case,
            self.dtype,
            self.runtime,
            self.median.as_secs_f64() * 1e6,
            self.steady.as_secs_f64() * 1e6,
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

/// Per-launch times of one case (see [`time_launches`]).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Median over samples of `iters` launches and one sync, divided by `iters`.
    pub median: Duration,
    /// Median over samples of the difference between `iters` and `iters / 2` launches (each
    /// followed by a sync), divided by the difference in launches: the steady-state cost of one
    /// more launch, without the fixed cost of a sample (the first launch's latency and the
    /// sync's round trip), which differs between frameworks and is not the op's.
    pub steady: Duration,
}

/// Times `launch` as described in the module docs.
///
/// `launch` must only queue work (no reads); `iters` launches form one sample.
pub fn time_launches<R: Runtime>(
    client: &ComputeClient<R>,
    samples: usize,
    iters: usize,
    mut launch: impl FnMut(),
) -> Timing {
    // Warm-up: compiles the kernel and settles clocks and the allocator.
    for _ in 0..iters.clamp(3, 20) {
        launch();
    }
    sync(client);
    let iters = iters.max(2);
    let half = iters / 2;
    let mut timed = |n: usize| {
        let start = Instant::now();
        for _ in 0..n {
            launch();
        }
        sync(client);
        start.elapsed()
    };
    let mut full = Vec::new();
    let mut steady = Vec::new();
    for _ in 0..samples.max(1) {
        let t_half = timed(half);
        let t_full = timed(iters);
        full.push(t_full / iters as u32);
        steady.push(t_full.saturating_sub(t_half) / (iters - half) as u32);
    }
    Timing {
        median: median(&mut full),
        steady: median(&mut steady),
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Picks a launch count so that one sample takes about `target` (at least 3 launches).
///
/// Measured on a batch, doubled until it runs for a tenth of the target, not on one launch: a
/// single launch-and-sync is dominated by the round trip to the device, and sizing the samples
/// from it made them far shorter than `target` (on the H100, 24 launches of a 35 µs add instead
/// of about 570), so each sample's fixed cost (the first launch's latency and the final sync)
/// was spread over too few launches and inflated the time per launch by 1-2 µs.
pub fn calibrate<R: Runtime>(
    client: &ComputeClient<R>,
    target: Duration,
    mut launch: impl FnMut(),
) -> usize {
    launch();
    sync(client);
    let mut batch = 1usize;
    loop {
        let start = Instant::now();
        for _ in 0..batch {
            launch();
        }
        sync(client);
        let elapsed = start.elapsed();
        if elapsed >= target / 10 || batch >= MAX_ITERS {
            let one = elapsed.as_secs_f64() / batch as f64;
            return ((target.as_secs_f64() / one.max(1e-9)) as usize).clamp(3, MAX_ITERS);
        }
        batch *= 2;
    }
}

/// Upper bound on the launches of one sample.
const MAX_ITERS: usize = 20_000;

/// Standard normal values (Box-Muller over a 64-bit LCG), the kind of data PyTorch's `randn`
/// gives its side of the comparison. The data's bits change the DRAM's energy per byte: on the
/// H100, PyTorch's f16 add replayed from a graph ran 1% faster on random operands than on a
/// short repeating pattern, so both sides time the same kind of numbers.
pub fn randn(n: usize, seed: u64) -> Vec<f32> {
    const A: u64 = 6364136223846793005;
    const C: u64 = 1442695040888963407;
    let mut state = seed.wrapping_mul(A).wrapping_add(C);
    let mut uniform = move || {
        state = state.wrapping_mul(A).wrapping_add(C);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let (r, t) = (
            (-2.0 * uniform().ln()).sqrt(),
            std::f64::consts::TAU * uniform(),
        );
        out.push((r * t.cos()) as f32);
        out.push((r * t.sin()) as f32);
    }
    out.truncate(n);
    out
}

/// A device tensor of `scale` times [`randn`] values.
pub fn randn_tensor<R: Runtime>(
    client: &ComputeClient<R>,
    shape: &[usize],
    dtype: ops::DType,
    scale: f32,
    seed: u64,
) -> ops::DeviceTensor<R> {
    let n = shape.iter().product();
    let data: Vec<f32> = randn(n, seed).into_iter().map(|v| v * scale).collect();
    ops::DeviceTensor::from_f32(client, &data, shape, dtype).unwrap()
}

/// Captures one call of `step` as a CUDA graph (None where the runtime has no graphs or the
/// capture fails, e.g. because the memory pool would have to grow inside it).
pub fn capture<R: Runtime>(client: &ComputeClient<R>, step: impl Fn()) -> Option<Graph<R>> {
    if !ops::caps::runtime_name(client).contains("cuda") {
        return None;
    }
    step();
    sync(client);
    client.graph_prepare().ok()?;
    // Warm-up after prepare: the pool serves the capture from what this call allocated.
    step();
    sync(client);
    client.start_capture().ok()?;
    step();
    match client.stop_capture() {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("bench: graph capture failed: {e:?}");
            None
        }
    }
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
        let timing = time_launches(client, 9, iters, &mut case.run);
        let r = BenchResult {
            family,
            case: case.name,
            dtype: case.dtype.name().to_string(),
            runtime: R::name(client),
            median: timing.median,
            steady: timing.steady,
            bytes: case.bytes,
            flops: case.flops,
        };
        println!("{}", r.to_json());
        results.push(r);
    }
    results
}

/// The families `cubellm bench` and the criterion benches know, by name.
pub const FAMILIES: &[&str] = &[
    "norm",
    "core",
    "matmul",
    "attention",
    "sparse",
    "quant",
    "cubek",
];

/// Families run only when asked for by name (`--family`): parameter sweeps, and the LM head at
/// the 1.5B vocabulary (host-side quantization of a 233M-weight head at setup).
pub const SWEEPS: &[&str] = &["gemv-sweep", "lm-head"];

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
        "gemv-sweep" => matmul::gemv_sweep(client),
        "lm-head" => screen::cases(client),
        _ => Vec::new(),
    }
}

pub mod attention;
pub mod core;
pub mod cubek;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod screen;
pub mod sparse;
