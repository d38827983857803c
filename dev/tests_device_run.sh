#!/usr/bin/env bash
# One device call, tests only: the ops kernels' CUDA tests named by OPS_TESTS (test-name filters,
# default "argmax embedding") beside the model's device tests on CUDA (the transformers
# fixtures, graph replay and greedy decoding one step ahead among them), and, where
# .devs/quant-test.xz is there too, the quant kernels' tests named by QUANT_TESTS (default
# "float_activations"). .devs/ops-test.xz and .devs/model-test.xz as dev/pack_device.sh leaves
# them. Results under $OUT/r (r.tgz).
#   OPS_TESTS="argmax" bash dev/tests_device_run.sh
set -u
source dev/device_setup.sh; begin_results
export CUBELLM_TEST_RUNTIMES=cuda
LIMIT=${TEST_LIMIT:-300}
(timeout $LIMIT .devs/ops-test --test-threads=8 ${OPS_TESTS:-argmax embedding} > $R/ops-test.log 2>&1
  echo "rc=$?" >> $R/ops-test.log) &
if [ -x .devs/quant-test ]; then
  (timeout $LIMIT .devs/quant-test --test-threads=8 ${QUANT_TESTS:-float_activations} \
    > $R/quant-test.log 2>&1; echo "rc=$?" >> $R/quant-test.log) &
fi
(cd crates/model && timeout $LIMIT ../../.devs/model-test --test-threads=8) > $R/model-test.log 2>&1
echo "rc=$?" >> $R/model-test.log
wait
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
