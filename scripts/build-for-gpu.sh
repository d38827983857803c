#!/usr/bin/env bash
# Builds, on a CPU machine, what the GPU machine runs, into .device/ (git-ignored):
#   .device/kernels-test   the cross-runtime kernel tests (run with CUBELLM_TEST_RUNTIMES=cuda)
#   .device/model-test     the model tests (loading, transformers fixtures) on every runtime
#   .device/cli            the CLI (selfcheck, bench, generate)
#   .device/ops-bench      the criterion benches (optional: pass --with-criterion)
# plus the python scripts the GPU-side benchmarks use. Copy the folder over and run from the
# repository root, e.g.:
#   CUBELLM_TEST_RUNTIMES=cuda .device/kernels-test --test-threads=1
#   .device/cli --runtime cuda bench > ours.jsonl && python3 scripts/bench_torch.py > torch.jsonl
#   python3 scripts/bench_table.py ours.jsonl torch.jsonl
# No CUDA toolkit is needed here: cudarc loads libcuda/libnvrtc at run time (CUDARC_CUDA_VERSION
# in .cargo/config.toml picks the driver API, 13000 for CUDA 13).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
mkdir -p .device
copy_test() { # $1 = cargo args; $2 = destination
  cargo test --release --locked "${@:1:$#-1}" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys,shutil
dst=sys.argv[1]
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        shutil.copy(m["executable"], dst); print("built", dst)' "${@: -1}"
}
copy_test --test kernels .device/kernels-test
copy_test --test model .device/model-test
cargo build --release --locked -p cli
cp target/release/cli .device/cli && echo "built .device/cli"
if [ "${1:-}" = "--with-criterion" ]; then
  copy_test --bench ops .device/ops-bench
fi
# Compressed copies, for carrying to the GPU machine under its 64 MiB limit.
mkdir -p .devz && grep -qx '/.devz/' .git/info/exclude || echo '/.devz/' >> .git/info/exclude
for f in .device/*; do gzip -c "$f" > ".devz/$(basename "$f").gz"; done
du -sh .device .devz
