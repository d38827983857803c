#!/usr/bin/env bash
# One device call: a CUDA test binary of the candidate build, then a same-call A/B of decode
# builds through dev/ab_device_run.sh (label main runs .devs/cubellm-main.xz, copied to
# .devs/cubellm, which labels without a binary of their own run). Results under $OUT/r.
#
#   TEST="quant-test float_activations" LABELS="main wip" MODES="w8a8 fp8" \
#     bash dev/test_ab_device_run.sh
#
# TEST: a binary under .devs/ (from crates/<its crate>, CUBELLM_TEST_RUNTIMES=cuda) and its
# filter; COPIES: "from:to" label pairs whose binary is copied (a second label for one build with
# other ARGS_ or ENV_ settings); the rest as dev/ab_device_run.sh.
set -u
source dev/device_setup.sh
begin_results
cp .devs/cubellm-main .devs/cubellm
for pair in ${COPIES:-}; do cp ".devs/cubellm-${pair%%:*}" ".devs/cubellm-${pair##*:}"; done
start_model .devs/cubellm 240
if [ -n "${TEST:-}" ]; then
  set -- $TEST
  crate=${1%-test}
  (cd "crates/$crate" && CUBELLM_TEST_RUNTIMES=cuda timeout 200 "../../.devs/$1" "${@:2}") \
    > "$R/test.log" 2>&1
  echo "$TEST rc=$? $(grep -E '^test result' "$R/test.log" | tail -1)"
fi
wait_model
bash dev/ab_device_run.sh
