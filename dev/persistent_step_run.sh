#!/usr/bin/env bash
# One persistent kernel for the decode step against the five-launch chain, priced by a synthetic
# (dev/add_controls/persistent_step.cu), on the GPU machine from the repository root, one call of
# about a minute: built with nvcc, run RUNS times (default 2; 8 alternating rounds each,
# PERSISTENT_ROUNDS), the SM clocks noted. Then, where .devs/lab.xz was carried (the lab binary,
# `cargo build --release --locked -p cubellm-lab`), the same weight stream written in CubeCL
# (`lab --runtime cuda persistent GROUP`, dev/lab/src/persistent*.rs: the u32 stream, the ring
# chain, the bf16 GEMV chain, the layers' dense math): checked, then timed per step.
# Results under $OUT/r (r.tgz): persistent.txt, lab-persistent.jsonl and .log.
set -u
source dev/device_setup.sh; begin_results
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $R/clocks.txt 2>&1
if nvcc -O3 -arch=sm_90a -o /tmp/persistent_step dev/add_controls/persistent_step.cu > $R/persistent-build.log 2>&1; then
  for round in $(seq ${RUNS:-2}); do
    echo "== run $round" >> $R/persistent.txt
    timeout 150 /tmp/persistent_step >> $R/persistent.txt 2>&1; echo "rc=$?" >> $R/persistent.txt
  done
  cat $R/clocks.txt $R/persistent.txt
else
  cat $R/persistent-build.log
fi
if [ -x .devs/lab ]; then
  # One process a group, so that a group that hangs leaves the others their results.
  for group in "sizes persistent" "ring chain" "gemv chain" "layer math"; do
    timeout 90 .devs/lab --runtime cuda persistent "$group" >> $R/lab-persistent.jsonl 2>> $R/lab-persistent.log
    echo "lab $group: rc=$?" >> $R/lab-persistent.log
  done
  cat $R/lab-persistent.log
  # A case is a whole step of 28 layers.
  python3 - $R/lab-persistent.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    us = r["us_steady"] or r["us"]
    print(f"  {r['case']:<45} {us / 28:7.2f} us a layer, {r['bytes'] / us / 1e3:7.0f} GB/s")
PY
fi
