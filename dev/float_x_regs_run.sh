#!/usr/bin/env bash
# Lab A/B, on a binary built with dev/attempts/float-x-in-registers.patch applied (its
# CUBELLM_LAB_XREGS switch of the float-activation GEMV's plan):
# x staged per cube in shared memory after a cube-wide maximum (0) against each lane
# converting its own x fragments, scaled per step and quad (1). On the GPU machine from the
# repository root, one call of about 7 minutes: the kernel's CUDA tests and the model's
# float-decode test under both, then CUPTI per-kernel tables of the W8A8 and FP8 decode step
# (6-layer 1.5B shape), two rounds.
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
start_model $C 150 6
build_trace_lib $R/trace-build.log
export CUBELLM_TEST_RUNTIMES=cuda
for v in 1 0; do
  CUBELLM_LAB_XREGS=$v timeout 200 .devs/quant-test --test-threads=8 float_activations \
    > $R/quant-test_$v.log 2>&1; echo "rc=$?" >> $R/quant-test_$v.log
  (cd crates/model && CUBELLM_LAB_XREGS=$v timeout 90 ../../.devs/model-test --test-threads=4 \
    float_activation --nocapture) > $R/model-test_$v.log 2>&1; echo "rc=$?" >> $R/model-test_$v.log
done
grep -h "test result\|rc=\|FAILED\|panicked\|KL\|kl" $R/*-test_*.log | head -30
wait_model
for round in 1 2; do
  for mode in w8a8 fp8; do
    for v in 0 1; do
      CUBELLM_LAB_XREGS=$v TRACE_LIB=/tmp/libkernel_trace.so timeout 60 \
        bash dev/profile/decode_profile.sh $C /tmp/big6 $R/prof_${v}_$round $mode >> $R/profile.out 2>&1
      echo "== $mode xregs=$v round $round: $(grep -o '"decode_tok_s":[0-9.]*' $R/prof_${v}_$round/run_$mode.json)"
      grep -h "^per layer\|^step" "$R/prof_${v}_$round/table_$mode.md" 2>/dev/null
    done
  done
done
rm -f $R/prof_*/copies_*.csv; gzip -f $R/prof_*/trace_*.csv 2>/dev/null
