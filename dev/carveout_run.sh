#!/usr/bin/env bash
# Whether the decode attention's 206 KB of shared memory delays its start beside the qkv
# projection, on the GPU machine from the repository root: dev/add_controls/carveout.cu (the
# synthetic chain with the attention stand-in at 43 KB and 206 KB of shared memory, the stages
# under the driver's carveout and under the largest) in two alternating rounds ($OUT/r/carveout.txt),
# then, where .devs/cubellm.xz is a lab build with dev/attempts/carveout-lab-switch.patch, the
# 6-layer CUPTI tables and bench-generate with and without CUBELLM_LAB_CARVEOUT=max
# (dev/env_ab_prof_run.sh; MODES default "none w8a8", VARIANTS and BG_VARIANTS as it takes them,
# default base and max). Results under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
if nvcc -O3 -arch=sm_90a -o /tmp/carveout dev/add_controls/carveout.cu > $R/carveout-build.log 2>&1; then
  for round in 1 2; do
    timeout 60 /tmp/carveout >> $R/carveout.txt 2>&1
    timeout 60 /tmp/carveout max >> $R/carveout.txt 2>&1
  done
  cat $R/carveout.txt
else
  cat $R/carveout-build.log
fi
[ -e .devs/cubellm ] || exit 0
VARIANTS="${VARIANTS:-base: max:CUBELLM_LAB_CARVEOUT=max}" MODES="${MODES:-none w8a8}" ROUNDS=2 BG=1 \
  bash dev/env_ab_prof_run.sh
