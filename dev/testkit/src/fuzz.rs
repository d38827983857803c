//! The harness of the bounded, seeded fuzz tests (`tests/fuzz.rs` of the model, sparse and quant
//! crates): every case runs on its own thread under `catch_unwind`, with a time limit and an
//! allocation cap, and a failure names the target, the seed and the input.
//!
//! - **Allocation cap.** No single allocation of a case may exceed [`ALLOC_CAP`] (256 MiB): the
//!   inputs are small, so anything near it is a size taken from the input without a check.
//!   [`CappedAlloc`] refuses it, after writing the target and seed to stderr (without
//!   allocating), and the refusal aborts the test binary (`handle_alloc_error`). Only case
//!   threads have a cap. A `#[global_allocator]` has to be declared in each test binary, so each
//!   fuzz test file declares
//!   `#[global_allocator] static ALLOC: testkit::fuzz::CappedAlloc = testkit::fuzz::CappedAlloc;`.
//! - **Time limit.** A case that gives no result within [`CASE_TIMEOUT`] (30 s, a debug build on
//!   a loaded CI machine) fails as a hang.
//! - **Environment.** `CUBELLM_FUZZ_ITERS=N` runs N cases per target instead of the target's
//!   default ([`iters`]); `CUBELLM_FUZZ_SEED=S` runs only the case of seed `S`, the one a failure
//!   names ([`seeds`]). Inputs are derived from the seed with `rand`'s `StdRng`, so a run is
//!   reproducible.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;

/// One case may not take longer than this (debug build, loaded CI machine): past it, it hangs.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(30);
/// No single allocation of a case may exceed this: the inputs are a few KiB, so anything near it
/// is a length taken from the input without a check.
pub const ALLOC_CAP: usize = 256 << 20;

thread_local! {
    /// The allocation cap of this thread (only case threads have one).
    static CAP: Cell<usize> = const { Cell::new(usize::MAX) };
    /// The target and seed of the case this thread runs, for the report of a refused allocation.
    static CASE: Cell<(&'static str, u64)> = const { Cell::new(("", 0)) };
}

/// The system allocator, refusing single allocations above the case thread's cap
/// ([`ALLOC_CAP`]). A refused allocation aborts the test binary (`handle_alloc_error`) after
/// naming the target and seed.
pub struct CappedAlloc;

unsafe impl GlobalAlloc for CappedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if over_cap(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if over_cap(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if over_cap(new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Whether `size` exceeds this thread's cap; if so, says so on stderr without allocating.
fn over_cap(size: usize) -> bool {
    let cap = CAP.try_with(Cell::get).unwrap_or(usize::MAX);
    if size <= cap {
        return false;
    }
    let (target, seed) = CASE.try_with(Cell::get).unwrap_or(("?", 0));
    let mut buf = StackBuf([0; 256], 0);
    let _ = std::fmt::Write::write_fmt(
        &mut buf,
        format_args!(
            "\nFUZZ FAILURE: {target} seed {seed}: allocation of {size} bytes (cap {cap}); \
             replay with CUBELLM_FUZZ_SEED={seed}\n"
        ),
    );
    let _ = std::io::stderr().write_all(&buf.0[..buf.1]);
    true
}

/// A fixed buffer to format into inside the allocator (which must not allocate).
struct StackBuf([u8; 256], usize);

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.0.len() - self.1);
        self.0[self.1..self.1 + n].copy_from_slice(&s.as_bytes()[..n]);
        self.1 += n;
        Ok(())
    }
}

/// Cases per target: `CUBELLM_FUZZ_ITERS` when set, else `default`.
pub fn iters(default: usize) -> usize {
    match std::env::var("CUBELLM_FUZZ_ITERS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CUBELLM_FUZZ_ITERS={v:?} is not a number")),
        Err(_) => default,
    }
}

/// The seeds of a target: only `CUBELLM_FUZZ_SEED` when set, else [`iters`]`(default_cases)`
/// seeds starting at `base * 1_000_003` (so targets with different `base`s do not share seeds).
pub fn seeds(base: u64, default_cases: usize) -> Vec<u64> {
    match std::env::var("CUBELLM_FUZZ_SEED") {
        Ok(s) => vec![s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CUBELLM_FUZZ_SEED={s:?} is not a number"))],
        Err(_) => (0..iters(default_cases) as u64)
            .map(|i| base.wrapping_mul(1_000_003).wrapping_add(i))
            .collect(),
    }
}

/// The check of one case: `Ok` when the properties hold, else the violation.
pub type Body = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// Runs `make(rng)` for each seed of `target` ([`seeds`]), with `rng` seeded by the seed; the
/// returned description names the input and the closure checks it (see [`run_case`]).
pub fn run<F>(target: &'static str, base: u64, default_cases: usize, mut make: F)
where
    F: FnMut(&mut StdRng) -> (String, Body),
{
    for seed in seeds(base, default_cases) {
        let (input, body) = make(&mut StdRng::seed_from_u64(seed));
        run_case(target, seed, input, body);
    }
}

/// Runs one case on a fresh thread (8 MiB of stack, as a main thread has) under `catch_unwind`,
/// with the allocation cap: a panic, a returned property violation or a case that does not
/// finish within [`CASE_TIMEOUT`] fails the test with the target, seed and `input`.
pub fn run_case(target: &'static str, seed: u64, input: String, body: Body) {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("{target}-{seed}"))
        .stack_size(8 << 20)
        .spawn(move || {
            CASE.with(|c| c.set((target, seed)));
            CAP.with(|c| c.set(ALLOC_CAP));
            let result = panic::catch_unwind(AssertUnwindSafe(body));
            CAP.with(|c| c.set(usize::MAX));
            let _ = tx.send(result);
        })
        .expect("spawn a case thread");
    let input = truncate(&input, 2000);
    match rx.recv_timeout(CASE_TIMEOUT) {
        Ok(Ok(Ok(()))) => handle.join().expect("the case thread ended"),
        Ok(Ok(Err(violation))) => panic!(
            "FUZZ FAILURE: {target} seed {seed}: {violation}\n  replay: CUBELLM_FUZZ_SEED={seed}\n  input: {input}"
        ),
        Ok(Err(payload)) => panic!(
            "FUZZ FAILURE: {target} seed {seed}: panicked: {}\n  replay: CUBELLM_FUZZ_SEED={seed}\n  input: {input}",
            panic_message(&payload)
        ),
        Err(_) => panic!(
            "FUZZ FAILURE: {target} seed {seed}: no result after {CASE_TIMEOUT:?} (hang or runaway)\n  replay: CUBELLM_FUZZ_SEED={seed}\n  input: {input}"
        ),
    }
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".into()
    }
}

/// The first `max` characters, with a note of how much was cut.
pub fn truncate(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        s.to_string()
    } else {
        let head: String = s.chars().take(max).collect();
        format!("{head}... ({n} characters)")
    }
}
