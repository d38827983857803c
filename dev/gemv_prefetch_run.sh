#!/usr/bin/env bash
# Lab A/B, on a binary built with dev/attempts/gemv-prefetch-before-wait.patch applied (its
# CUBELLM_LAB_PREFETCH / CUBELLM_LAB_SHORT_SPLITS switches of the bf16 GEMV's plan): how many
# weight vectors a lane loads before `griddepcontrol.wait`.
# On the GPU machine from the repository root, one call of about 8 minutes:
#   the ops matmul tests and the model's transformers test under each switch, then CUPTI
#   per-kernel tables of the bf16 decode step (6-layer 1.5B shape) per variant, then
#   dev/float_x_ncu_run.sh (Nsight Compute on the float-activation gate-up).
# Variants: base (one vector, the default), 2w (all of K where that is at most 2 vectors a
# lane: qkv, o), 2 (two vectors a lane everywhere), s2_3w (qkv and o on 2 planes per column,
# all of K's 3 vectors a lane before the wait).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
start_model $C 150 6
build_trace_lib $R/trace-build.log
export CUBELLM_TEST_RUNTIMES=cuda
variant_env() {
  case $1 in
    base) echo "CUBELLM_LAB_PREFETCH=1" ;;
    2w) echo "CUBELLM_LAB_PREFETCH=2w" ;;
    2) echo "CUBELLM_LAB_PREFETCH=2" ;;
    s2_3w) echo "CUBELLM_LAB_PREFETCH=3w CUBELLM_LAB_SHORT_SPLITS=2" ;;
  esac
}
for v in 2 s2_3w; do
  env $(variant_env $v) timeout 150 .devs/ops-test --test-threads=8 matmul \
    > $R/ops-test_$v.log 2>&1; echo "rc=$?" >> $R/ops-test_$v.log
done
wait_model
for v in 2 s2_3w; do
  (cd crates/model && env $(variant_env $v) timeout 90 ../../.devs/model-test --test-threads=4 \
    logits_and_greedy_tokens_match_transformers) > $R/model-test_$v.log 2>&1
  echo "rc=$?" >> $R/model-test_$v.log
done
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test_*.log | head -20
for round in 1 2; do
  for v in base 2w 2 s2_3w; do
    env $(variant_env $v) TRACE_LIB=/tmp/libkernel_trace.so timeout 60 \
      bash dev/profile/decode_profile.sh $C /tmp/big6 $R/prof_${v}_$round none >> $R/profile.out 2>&1
    echo "== $v round $round: $(grep -o '"decode_tok_s":[0-9.]*' $R/prof_${v}_$round/run_none.json)"
    grep -h "^per layer\|^step" "$R/prof_${v}_$round/table_none.md" 2>/dev/null
  done
done
rm -f $R/prof_*/copies_*.csv; gzip -f $R/prof_*/trace_*.csv 2>/dev/null
R0=$R
bash dev/float_x_ncu_run.sh
