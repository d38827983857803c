#!/usr/bin/env bash
# The SIMT 8-bit GEMV's weights staged through shared memory by cp.async
# (crates/quant/src/gemm8/float_x_simt/staged.rs) against its register loop, on the GPU machine
# from the repository root, one call of about 7 minutes, from a lab build whose plan reads
# CUBELLM_LAB_STAGES (0: the register loop) and CUBELLM_LAB_MINCUBES:
#   the SIMT kernel's CUDA tests (staged, and the register loop) and the model's float-decode
#   test against transformers, then dev/env_ab_prof_run.sh over VARIANTS (6-layer CUPTI tables
#   and bench-generate on the 28-layer model, W8A8 and FP8).
# .devs/ as dev/pack_device.sh leaves it (cubellm, quant-test, model-test). Results under $OUT/r.
set -u
mkdir -p $OUT/r
for f in .devs/*.xz; do xz -dkf "$f"; done; chmod +x .devs/*
export CUBELLM_TEST_RUNTIMES=cuda
for v in staged:CUBELLM_LAB_STAGES=3 registers:CUBELLM_LAB_STAGES=0; do
  env ${v#*:} timeout 200 .devs/quant-test --test-threads=8 float_activations_simt \
    > $OUT/r/quant-test_${v%%:*}.log 2>&1; echo "rc=$?" >> $OUT/r/quant-test_${v%%:*}.log
done
(cd crates/model && timeout 200 ../../.devs/model-test --test-threads=4 float_activation \
  --nocapture) > $OUT/r/model-test.log 2>&1; echo "rc=$?" >> $OUT/r/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $OUT/r/*-test*.log | head -20
export -n CUBELLM_TEST_RUNTIMES
VARIANTS=${VARIANTS:-"base:CUBELLM_LAB_STAGES=0 s3: s2:CUBELLM_LAB_STAGES=2 s3nocap:CUBELLM_LAB_MINCUBES=0"} \
  BG_VARIANTS=${BG_VARIANTS:-"base:CUBELLM_LAB_STAGES=0 s3: s2:CUBELLM_LAB_STAGES=2"} \
  MODES=${MODES:-"w8a8 fp8"} BG=1 bash dev/env_ab_prof_run.sh
