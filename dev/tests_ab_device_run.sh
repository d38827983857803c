#!/usr/bin/env bash
# One device call: the model's device tests on CUDA (.devs/model-test.xz) while the 1.5B-shape
# checkpoint is built, then a same-call A/B of two CLI builds (.devs/cubellm-main.xz and
# .devs/cubellm-new.xz): bf16 over ROUNDS_BF16 rounds (3), then FP8 and W8A8 with their 8-bit LM
# heads over ROUNDS_8 rounds (2), by dev/ab_device_run.sh. Results under $OUT/r (tests, bf16 A/B)
# and $OUT/h/r (the 8-bit A/B).
set -u
source dev/device_setup.sh; begin_results
(cd crates/model && CUBELLM_TEST_RUNTIMES=cuda timeout ${TEST_LIMIT:-240} ../../.devs/model-test \
  --test-threads=8) > $R/model-test.log 2>&1 &
TESTS=$!
ensure_big_model .devs/cubellm-new $R/setup.log 240
wait $TESTS; echo "rc=$?" >> $R/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $R/model-test.log | head -10
LABELS="main new" MODES="none" ROUNDS=${ROUNDS_BF16:-3} BUDGET=${BUDGET_BF16:-200} \
  bash dev/ab_device_run.sh 2>&1 | tail -4
OUT=$OUT/h LABELS="main new" MODES="fp8 w8a8" ARGS_main=--quant-lm-head ARGS_new=--quant-lm-head \
  ROUNDS=${ROUNDS_8:-2} BUDGET=${BUDGET_8:-200} bash dev/ab_device_run.sh 2>&1 | tail -6
