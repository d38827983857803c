#!/usr/bin/env bash
# One call on the GPU machine, from the repository root: CUDA tests of the ops (OPS_TESTS, test
# name filters), the quant kernels (QUANT_TESTS; none when empty) and the model's device tests
# (the transformers fixtures, graph replay among them) while the 1.5B-shape checkpoint is built,
# then the recorded end-to-end run beside the peer (scripts/bench_e2e.sh, MODES as below,
# RUNS=2). .devs/ as dev/pack_device.sh leaves it. Results under $OUT/r (r.tgz).
#   OPS_TESTS="norm qkv" QUANT_TESTS="w4a16" bash dev/record_run.sh
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
start_model $C 240
export CUBELLM_TEST_RUNTIMES=cuda
LIMIT=${TEST_LIMIT:-330}
(timeout $LIMIT .devs/ops-test --test-threads=8 ${OPS_TESTS:-attention::decode \
  attention::rope_decode attention::ragged attention::cache burn::attention} \
  > $R/ops-test.log 2>&1; echo "rc=$?" >> $R/ops-test.log) &
OPS_PID=$!
if [ -n "${QUANT_TESTS:-}" ]; then
  (timeout $LIMIT .devs/quant-test --test-threads=4 $QUANT_TESTS > $R/quant-test.log 2>&1
    echo "rc=$?" >> $R/quant-test.log) &
  QUANT_PID=$!
fi
(cd crates/model && timeout $LIMIT ../../.devs/model-test --test-threads=8) > $R/model-test.log 2>&1
echo "rc=$?" >> $R/model-test.log
wait $OPS_PID ${QUANT_PID:-}
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
wait_model
unset CUBELLM_TEST_RUNTIMES
MODES=${MODES:-"none w8a8 fp8 w4a16 w4a16+head w8a8+head fp8+head"} RUNS=2 \
  bash scripts/bench_e2e.sh $C /tmp/big $R/e2e.jsonl 512 > $R/e2e.log 2>&1
echo "e2e rc=$?"
tail -12 $R/e2e.log
