#!/usr/bin/env bash
# Packs what dev/decode_device_run.sh runs: the binaries built into .device/ (see
# scripts/build-for-gpu.sh), xz-compressed into .devs/ (git-ignored), so that they fit the 64 MiB a
# device call may carry. Names: cubellm, ops-test, quant-test, model-test, and commit.txt.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.devs/' .git/info/exclude 2>/dev/null || echo '/.devs/' >> .git/info/exclude
mkdir -p .devs
rm -f .devs/*
for f in cubellm ops-test quant-test model-test; do
  [ -f ".device/$f" ] && xz -T2 -6 -c ".device/$f" > ".devs/$f.xz"
done
git describe --always --dirty > .devs/commit.txt
du -sh .devs
