//! Bounded, seeded fuzzing of everything in a model directory that a user's files reach:
//! safetensors headers and sharded indexes (`WeightStore`), `config.json` and
//! `generation_config.json`, and the tokenizer and chat template files.
//!
//! Each target starts from valid inputs (files written here, or the committed fixtures under
//! `tests/fixtures/hf`), mutates them (byte flips, truncation, JSON values replaced, deleted or
//! added, edge-case numbers, adversarial fragments) and checks that every case returns Ok or a
//! typed, one-line error: no panic (each case runs under `catch_unwind`), no hang (a per-case time
//! limit), no allocation sized by an unchecked length (this binary's allocator refuses any single
//! allocation above 256 MiB and names the case), and Ok results that are sane (tensor bytes lie
//! inside the file, configs' derived sizes do not overflow, ...).
//!
//! Cases per target: 300 to 2000 by default (a few seconds each in a debug build);
//! `CUBELLM_FUZZ_ITERS=N` runs N per target, `CUBELLM_FUZZ_SEED=S` replays the one case of seed
//! `S` that a failure names. The inputs are derived from the seed with `rand`'s `StdRng`, so a
//! run is reproducible.

// The fuzz allocator of `testkit::fuzz`: refuses single allocations above `ALLOC_CAP` in case
// threads (a `#[global_allocator]` has to be declared in each test binary).
#[global_allocator]
static ALLOC: testkit::fuzz::CappedAlloc = testkit::fuzz::CappedAlloc;

mod common;
#[path = "fuzz/config.rs"]
mod config;
#[path = "fuzz/harness.rs"]
mod harness;
#[path = "fuzz/safetensors.rs"]
mod safetensors;
#[path = "fuzz/tokenizer.rs"]
mod tokenizer;
