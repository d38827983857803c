#!/usr/bin/env bash
# Builds and runs a fresh crate outside this workspace that depends on cubellm exactly as the
# README's "Using cubellm from another crate" says: the dependency, the [patch.crates-io] lines
# for the two patched CubeCL crates, and a Cargo.lock that starts from this repository's (which
# carries the pliron repair). Runs the crate's program on wgpu (or the runtime given as $1).
#   scripts/outside_crate_check.sh [wgpu|cuda|auto]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
RUNTIME=${1:-wgpu}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/cubellm-outside-XXXXXX")
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR/src"
cat > "$DIR/Cargo.toml" <<TOML
[package]
name = "outside"
version = "0.1.0"
edition = "2021"

[dependencies]
cubellm = { path = "$REPO" }
cubecl = { version = "=0.11.0-pre.3", default-features = false, features = ["std"] }

[patch.crates-io]
cubecl-common = { path = "$REPO/vendor/cubecl-common" }
cubecl-cuda = { path = "$REPO/vendor/cubecl-cuda" }
TOML
cat > "$DIR/src/main.rs" <<'RS'
//! An outside crate using cubellm: RMSNorm of a small batch on the chosen runtime, checked
//! against the same arithmetic on the host.
use cubellm::ops::{self, DType, DeviceTensor};
use cubellm::{Backend, RuntimeChoice};
use cubecl::prelude::*;

fn run<R: Runtime>(client: &ComputeClient<R>) -> Result<f64, ops::OpsError> {
    let (rows, n) = (3, 64);
    let x: Vec<f32> = (0..rows * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 / 7.0).collect();
    let xd = DeviceTensor::from_f32(client, &x, &[rows, n], DType::F32)?;
    let wd = DeviceTensor::from_f32(client, &w, &[n], DType::F32)?;
    let got = ops::norm::rms_norm(client, &xd, &wd, 1e-6)?.to_f32_vec(client)?;
    let mut worst = 0.0f64;
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        for c in 0..n {
            let want = row[c] as f64 * inv * w[c] as f64;
            worst = worst.max((got[r * n + c] as f64 - want).abs());
        }
    }
    Ok(worst)
}

fn main() {
    let choice: RuntimeChoice = std::env::args().nth(1).unwrap_or("auto".into()).parse().unwrap();
    let backend: Backend = cubellm::runtime::resolve(choice).expect("a runtime with a device");
    let worst = cubellm::with_runtime!(backend, |client: R| run::<R>(&client)).expect("rms_norm");
    println!("rms_norm on {backend}: max abs error {worst:.2e}");
    assert!(worst < 1e-4, "wrong result");
}
RS
cp "$REPO/Cargo.lock" "$DIR/Cargo.lock"
cd "$DIR"
# Not --locked: cargo drops this workspace's members from the copied lock and adds the new crate,
# keeping every other version (and the pliron repair) as they are.
cargo build --quiet
cargo tree -e normal -i pliron-derive@0.17.0 --depth 1 | head -3
"$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug/outside" "$RUNTIME"
