#!/usr/bin/env bash
# The clustered decode attention's two hand-overs of its split partials (global memory and the
# cluster barrier's release, or `st.async` into the owning cube's shared memory:
# crates/ops/src/attention/cluster_merge.rs), on the GPU machine from the repository root, one
# binary under the lab switch CUBELLM_LAB_EXCHANGE (0 = global memory), built with
# dev/attempts/cluster-exchange-lab-switch.patch applied (the library keeps the exchange only):
#   bash dev/exchange_device_run.sh
# runs the attention's CUDA tests and the model's device tests (the transformers fixtures) with
# the exchange, then dev/env_ab_prof_run.sh for both hand-overs: CUPTI per-layer tables of the
# 6-layer 1.5B-shape model (MODES, default bf16 and W8A8) and `bench-generate` on the 28-layer
# model, two rounds each in alternating order. .devs/ as dev/pack_device.sh leaves it. Results
# under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
export CUBELLM_TEST_RUNTIMES=cuda
timeout 200 .devs/ops-test --test-threads=8 attention > $R/ops-test.log 2>&1
echo "rc=$?" >> $R/ops-test.log
(cd crates/model && timeout 200 ../../.devs/model-test --test-threads=4) > $R/model-test.log 2>&1
echo "rc=$?" >> $R/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
unset CUBELLM_TEST_RUNTIMES
VARIANTS="base:CUBELLM_LAB_EXCHANGE=0 exchange:CUBELLM_LAB_EXCHANGE=1" MODES=${MODES:-"none w8a8"} \
  ROUNDS=2 BG=1 BG_ROUNDS=2 bash dev/env_ab_prof_run.sh
