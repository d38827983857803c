#!/usr/bin/env bash
# Sourced by the dev/*_device_run.sh scripts on the GPU machine, from the repository root:
#   unpack_devs                  unpacks every .devs/*.xz, replacing what a warm machine kept
#                                from an earlier call, and makes the binaries executable
#   ensure_big_model CLI LOG [T] builds the demo tokenizer (/tmp/demo) and the 1.5B-shape
#                                checkpoint (/tmp/big, scripts/make_hf_fixtures.py --big, at most
#                                T seconds, default 240) unless /tmp/big is already there
unpack_devs() {
  local f
  for f in .devs/*.xz; do
    [ -e "$f" ] && xz -dkf "$f"
  done
  chmod +x .devs/* 2>/dev/null
  return 0
}

ensure_big_model() {
  local cli=$1 log=$2 limit=${3:-240}
  [ -d /tmp/big ] && return 0
  timeout 120 "$cli" make-demo-model --out /tmp/demo > "$log" 2>&1
  timeout "$limit" python3 scripts/make_hf_fixtures.py --big --tokenizer /tmp/demo \
    --out /tmp/big >> "$log" 2>&1
}
