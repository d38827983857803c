#!/usr/bin/env bash
# One persistent kernel for the decode step against the five-launch chain, priced by a synthetic
# (dev/add_controls/persistent_step.cu), on the GPU machine from the repository root, one call of
# about a minute: built with nvcc, run RUNS times (default 2; 8 alternating rounds each,
# PERSISTENT_ROUNDS), the SM clocks noted. Results under $OUT/r (r.tgz): persistent.txt.
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
