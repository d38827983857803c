#!/usr/bin/env bash
# One call on the GPU machine, from the repository root: the decode attention's CUDA tests and
# the model's device tests (the transformers fixtures, graph replay among them) side by side,
# while the 1.5B-shape checkpoint is built, then the recorded end-to-end run beside the peer
# (scripts/bench_e2e.sh, MODES as below, RUNS=2). .devs/ as dev/pack_device.sh leaves it
# (cubellm, ops-test, model-test). Results under $OUT/r (r.tgz).
#   bash dev/attention_record_run.sh
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
start_model $C 240
export CUBELLM_TEST_RUNTIMES=cuda
(timeout 330 .devs/ops-test --test-threads=8 attention::decode attention::rope_decode \
  attention::ragged attention::cache burn::attention > $R/ops-test.log 2>&1
  echo "rc=$?" >> $R/ops-test.log) &
OPS_PID=$!
(cd crates/model && timeout 330 ../../.devs/model-test --test-threads=8) > $R/model-test.log 2>&1
echo "rc=$?" >> $R/model-test.log
wait $OPS_PID
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
wait_model
unset CUBELLM_TEST_RUNTIMES
MODES=${MODES:-"none w8a8 fp8 w4a16 w4a16+head w8a8+head fp8+head"} RUNS=2 \
  bash scripts/bench_e2e.sh $C /tmp/big $R/e2e.jsonl 512 > $R/e2e.log 2>&1
echo "e2e rc=$?"
tail -12 $R/e2e.log
