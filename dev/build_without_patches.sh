#!/usr/bin/env bash
# Builds the model's device-test binary from a copy of HEAD whose workspace has no
# [patch.crates-io] table, i.e. with the released cubecl-common and cubecl-cuda instead of the
# vendored ones, to check on the GPU machine that the patches change speed only:
#   dev/build_without_patches.sh            # here: .devs/model-test-nopatch
#   (cd crates/model && CUBELLM_TEST_RUNTIMES=cuda ../../.devs/model-test-nopatch)   # there
set -euo pipefail
REPO=$(git rev-parse --show-toplevel)
DIR=${NOPATCH_DIR:-/tmp/cubellm-nopatch}
rm -rf "$DIR"
git -C "$REPO" worktree add -q --detach "$DIR" HEAD
trap 'git -C "$REPO" worktree remove --force "$DIR"' EXIT
python3 - "$DIR/Cargo.toml" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
open(p, "w").write(s[: s.index("[patch.crates-io]")])
PY
mkdir -p "$REPO/.devs"
cd "$DIR"
# Not --locked: Cargo swaps the two patched packages for the registry's in the lock.
cargo test --release -p cubellm-model --test device --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys,shutil
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"][0]=="test":
        shutil.copy(m["executable"], sys.argv[1]); print("built", sys.argv[1])' "$REPO/.devs/model-test-nopatch"
grep -A2 'name = "cubecl-cuda"' Cargo.lock | grep -q registry && echo "cubecl-cuda from the registry"
