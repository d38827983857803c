//! The model-specific part of the fuzz harness: `Fuzz` (seeded random choices, without a `rand`
//! dependency of the model crate), `Case`, and helpers to build and mutate model files. The shared
//! core (allocation cap, time limit, `CUBELLM_FUZZ_ITERS` / `CUBELLM_FUZZ_SEED`, running a case on
//! its own thread under `catch_unwind`) is `testkit::fuzz`.

use std::path::{Path, PathBuf};

/// A deterministic source of random choices: `rand`'s `StdRng::seed_from_u64(seed)`, reached
/// through `testkit::rng` and `testkit::random` (the model crate has no `rand` dependency of its
/// own, and adding one would change Cargo.lock), drawn 23 bits at a time.
pub struct Fuzz {
    draw: Box<dyn FnMut() -> f32>,
}

impl Fuzz {
    pub fn new(seed: u64) -> Self {
        let mut rng = testkit::rng(seed);
        // Uniform in [-2^23, 2^23]: 23 random mantissa bits per draw.
        let scale = (1u32 << 23) as f32;
        Self {
            draw: Box::new(move || testkit::random(&mut rng, 1, scale)[0]),
        }
    }

    fn bits23(&mut self) -> u64 {
        let v = (self.draw)();
        (v as i64 + (1 << 23)) as u64 & ((1 << 23) - 1)
    }

    pub fn u64(&mut self) -> u64 {
        (self.bits23() << 46) ^ (self.bits23() << 23) ^ self.bits23()
    }

    /// Uniform-enough in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.u64() % n as u64) as usize
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u64() as u8).collect()
    }

    /// An integer that is often at an edge: 0, 1, small, a power of two +-1, or the maximum.
    pub fn interesting_u64(&mut self) -> u64 {
        match self.below(8) {
            0 => 0,
            1 => 1,
            2 => self.below(64) as u64,
            3 => (1u64 << self.below(64))
                .wrapping_add(self.below(3) as u64)
                .wrapping_sub(1),
            4 => u64::MAX - self.below(4) as u64,
            5 => i64::MAX as u64,
            6 => u32::MAX as u64 + self.below(3) as u64 - 1,
            _ => self.u64(),
        }
    }
}

/// Runs the cases of `target` (`testkit::fuzz::seeds`): `make` builds a case from its seed
/// (input description and the code to run), which then runs as `testkit::fuzz::run_case` runs it:
/// a panic, a returned property violation or a case that does not finish within the time limit
/// fails the test with the seed and input. `CUBELLM_FUZZ_SEED=S` runs only the case of seed `S`.
pub fn run<F>(target: &'static str, base_seed: u64, default_cases: usize, mut make: F)
where
    F: FnMut(&mut Fuzz, u64) -> Case,
{
    for seed in testkit::fuzz::seeds(base_seed, default_cases) {
        let mut fz = Fuzz::new(seed);
        let case = make(&mut fz, seed);
        run_case(target, seed, case);
    }
}

/// One case: what it feeds the function under test (for the failure report) and the check.
pub struct Case {
    pub input: String,
    pub body: testkit::fuzz::Body,
}

impl Case {
    pub fn new(input: String, body: impl FnOnce() -> Result<(), String> + Send + 'static) -> Self {
        Self {
            input,
            body: Box::new(body),
        }
    }
}

/// Runs one case on its own thread under `catch_unwind`, with the allocation cap and the time
/// limit (`testkit::fuzz::run_case`).
pub fn run_case(target: &'static str, seed: u64, case: Case) {
    testkit::fuzz::run_case(target, seed, case.input, case.body);
}

/// Bytes as text when they are mostly printable (non-printable bytes escaped), else as hex.
pub fn show_bytes(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(600)];
    let printable = shown
        .iter()
        .filter(|b| b.is_ascii_graphic() || **b == b' ')
        .count();
    let body = if printable * 10 >= shown.len() * 8 {
        shown.escape_ascii().to_string()
    } else {
        shown.iter().map(|b| format!("{b:02x}")).collect()
    };
    format!("{} bytes: {body}", bytes.len())
}

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("cubellm-fuzz-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A random JSON value, biased toward what breaks parsers of config files: edge numbers, wrong
/// types, empty and nested containers.
pub fn random_json(fz: &mut Fuzz, depth: usize) -> serde_json::Value {
    use serde_json::{json, Value};
    let leaf = depth == 0 || fz.chance(70);
    if leaf {
        return match fz.below(14) {
            0 => Value::Null,
            1 => Value::Bool(fz.chance(50)),
            2 => json!(0),
            3 => json!(-(fz.below(1000) as i64) - 1),
            4 => json!(fz.interesting_u64()),
            5 => json!(i64::MIN),
            6 => json!(*fz.pick(&[0.5, -0.0, 1e308, -1e308, 1e-320, 3.0, 7.5, 1e19, 2.0e9])),
            7 => json!(fz.below(5000)),
            8 => json!(""),
            9 => json!(*fz.pick(&[
                "silu", "llama3", "default", "yarn", "bfloat16", "qwen2", "-1", "1e400", "NaN"
            ])),
            10 => json!(fz.pick(&[u64::MAX.to_string(), "9".repeat(40)])),
            11 => json!([]),
            12 => json!({}),
            _ => json!(fz.below(16) * 2),
        };
    }
    if fz.chance(50) {
        let n = fz.below(4);
        Value::Array((0..n).map(|_| random_json(fz, depth - 1)).collect())
    } else {
        let mut map = serde_json::Map::new();
        for _ in 0..fz.below(4) {
            let key = fz
                .pick(&[
                    "rope_type",
                    "type",
                    "factor",
                    "rope_theta",
                    "a",
                    "",
                    "__metadata__",
                ])
                .to_string();
            map.insert(key, random_json(fz, depth - 1));
        }
        Value::Object(map)
    }
}

/// Mutates a JSON value in place: replaces, deletes or adds a value somewhere in the tree.
pub fn mutate_json(fz: &mut Fuzz, v: &mut serde_json::Value, keys: &[&str]) {
    use serde_json::Value;
    match v {
        Value::Object(map) if !map.is_empty() && fz.chance(75) => {
            let i = fz.below(map.len());
            let key = map.keys().nth(i).expect("in range").clone();
            match fz.below(10) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    let key = fz.pick(keys).to_string();
                    map.insert(key, random_json(fz, 2));
                }
                2..=4 => {
                    map.insert(key, random_json(fz, 2));
                }
                _ => mutate_json(fz, map.get_mut(&key).expect("present"), keys),
            }
        }
        Value::Array(list) if !list.is_empty() && fz.chance(75) => {
            let i = fz.below(list.len());
            match fz.below(6) {
                0 => {
                    list.remove(i);
                }
                1 => list.push(random_json(fz, 1)),
                2 => list[i] = random_json(fz, 2),
                _ => mutate_json(fz, &mut list[i], keys),
            }
        }
        other => *other = random_json(fz, 2),
    }
}

/// Byte-level mutations: flips, overwrites, insertions, deletions, truncation.
pub fn mutate_bytes(fz: &mut Fuzz, data: &mut Vec<u8>) {
    for _ in 0..1 + fz.below(4) {
        if data.is_empty() {
            let n = 1 + fz.below(8);
            data.extend(fz.bytes(n));
            continue;
        }
        let i = fz.below(data.len());
        match fz.below(6) {
            0 => data[i] ^= 1 << fz.below(8),
            1 => data[i] = fz.u64() as u8,
            2 => {
                let n = 1 + fz.below(16);
                let extra = fz.bytes(n);
                data.splice(i..i, extra);
            }
            3 => {
                let end = (i + 1 + fz.below(32)).min(data.len());
                data.drain(i..end);
            }
            4 => data.truncate(i),
            _ => {
                let b = *fz.pick(b"{}[]\",:0-9\\\x00\xff");
                data[i] = b;
            }
        }
    }
}
