#!/usr/bin/env bash
# The sampler's small-top-k plan against the radix plan on the GPU machine, from the repository
# root, about 1 minute: the sampling CUDA tests of ops and model, then `lab samplelab` on bf16
# rows (both plans where the small one serves the parameters). .devs/ as `dev/pack_device.sh`
# leaves it, plus lab.xz; results under $OUT/r. End-to-end sampled against greedy decode:
# dev/sampling_device_run.sh (the A/B of the two plans end to end ran with the lab switch of
# dev/attempts/sampling-radix-lab-switch.patch, CUBELLM_LAB_RADIX=1 forcing the radix plan).
set -u
source dev/device_setup.sh; begin_results
export CUBELLM_TEST_RUNTIMES=cuda
timeout 120 .devs/ops-test --test-threads=8 sampling > $R/ops-test.log 2>&1
echo "rc=$?" >> $R/ops-test.log
(cd crates/model && timeout 90 ../../.devs/model-test --test-threads=4 sampl) \
  > $R/model-test.log 2>&1; echo "rc=$?" >> $R/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log
timeout 120 .devs/lab --runtime cuda samplelab "bf16" > $R/samplelab.jsonl 2> $R/samplelab.log
echo "samplelab rc=$?"
python3 -c 'import json,sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        d=json.loads(l); print("%-58s %8.2f us" % (d["case"], d["us_steady"]))' $R/samplelab.jsonl
