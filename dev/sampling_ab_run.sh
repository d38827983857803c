#!/usr/bin/env bash
# The sampled decode step with the presence mark in the draw's first kernel against the build
# before (.devs/cubellm-base.xz, carried beside this build's .devs/), on the GPU machine from
# the repository root, about 3 minutes: the sampling CUDA tests of ops and model, then W4A16
# with top-k 50, top-p 0.95 and repetition penalty 1.1 (the slowest setting against greedy),
# `bench-generate --runs 2` on the 28-layer 1.5B shape, two alternating rounds.
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
start_model $C 240
export CUBELLM_TEST_RUNTIMES=cuda
timeout 90 .devs/ops-test --test-threads=8 sampling > $R/ops-test.log 2>&1
echo "rc=$?" >> $R/ops-test.log
(cd crates/model && timeout 60 ../../.devs/model-test --test-threads=4 sampl) \
  > $R/model-test.log 2>&1; echo "rc=$?" >> $R/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log
wait_model
for round in 1 2; do
  for bin in cubellm-base cubellm; do
    timeout 60 .devs/$bin --runtime cuda bench-generate --model /tmp/big --prompt-len 512 \
      --new-tokens 128 --runs 2 --quant w4a16 --top-k 50 --top-p 0.95 \
      --repetition-penalty 1.1 > $R/${bin}_$round.json 2> $R/${bin}_$round.log
    echo "== $bin round $round: $(grep -h 'decode' $R/${bin}_$round.log | tail -2 | tr '\n' ' ')"
  done
done
