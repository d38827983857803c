#!/usr/bin/env bash
# Builds, on a CPU machine, what the GPU machine runs, into .device/ (git-ignored), with gzipped
# copies in .devz/ (what fits the 64 MiB a device call may carry):
#   .device/ops-test      the core ops' cross-runtime kernel tests (CUBELLM_TEST_RUNTIMES=cuda)
#   .device/quant-test    the quantization crate's kernel tests
#   .device/sparse-test   the block-sparse crate's kernel tests
#   .device/model-test    the model's device tests (loading, transformers fixtures)
#   .device/cubellm       the CLI (selfcheck, bench, generate, bench-generate)
#   .device/ops-bench     the criterion benches (optional: pass --with-criterion)
# Copy the folder over and run from the repository root, e.g.:
#   CUBELLM_TEST_RUNTIMES=cuda .device/ops-test --test-threads=8
#   .device/cubellm --runtime cuda bench > ours.jsonl && python3 scripts/bench_torch.py > torch.jsonl
#   python3 scripts/bench_table.py ours.jsonl torch.jsonl
# No CUDA toolkit is needed here: cudarc loads libcuda/libnvrtc at run time (CUDARC_CUDA_VERSION
# in .cargo/config.toml picks the driver API, 13000 for CUDA 13).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
mkdir -p .device
copy_test() { # $1.. = cargo args; last = destination
  cargo test --release --locked "${@:1:$#-1}" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys,shutil
dst=sys.argv[1]
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"][0] in ("test", "bench"):
        shutil.copy(m["executable"], dst); print("built", dst)' "${@: -1}"
}
copy_test -p cubellm-ops --test kernels .device/ops-test
copy_test -p cubellm-quant --test kernels .device/quant-test
copy_test -p cubellm-sparse --test kernels .device/sparse-test
copy_test -p cubellm-model --test device .device/model-test
cargo build --release --locked -p cli
cp target/release/cubellm .device/cubellm && echo "built .device/cubellm"
if [ "${1:-}" = "--with-criterion" ]; then
  copy_test -p cubellm-bench --bench ops .device/ops-bench
fi
# Compressed copies, for carrying to the GPU machine under its 64 MiB limit.
mkdir -p .devz && grep -qx '/.devz/' .git/info/exclude || echo '/.devz/' >> .git/info/exclude
for f in .device/*; do gzip -c "$f" > ".devz/$(basename "$f").gz"; done
du -sh .device .devz
