#!/usr/bin/env bash
# One device call for the tensor-core decode attention whose planes' merge buffers reuse the K/V
# stages' shared memory (long-cache cube 144 KB, clustered cube 153 KB, against 211 and 220 KB),
# run from the repository root on the GPU machine with .devs/ holding cubellm (the change),
# cubellm-base (the build before it), ops-test and model-test (the change's tests). STEPS picks:
#   tests    the attention kernel tests on CUDA (ops-test, OPS_FILTER: default all), while the
#            1.5B-shape model is built
#   long     bench-generate A/B of LONG_LABELS (default base new; label L runs .devs/cubellm-L)
#            (dev/ab_device_run.sh) at a 32k context (bf16), results in $OUT/long
#   short    the same A/B at 512 tokens (SHORT_MODES, default bf16 and W8A8), in $OUT/short
#   model    the model's device tests (transformers fixtures, graph replay, long context;
#            MODEL_FILTER narrows them)
#   profile  the 6-layer CUPTI tables of PROF_LABELS (default base new) at a 32k context
#            (dev/profile/decode_profile.sh), PROF_ROUNDS rounds (default 1) in alternating
#            order, in $OUT/r/prof-LABEL-ROUND
#   STEPS="tests long short" bash dev/stage_merge_run.sh
set -u
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
source "$(dirname "$0")/device_setup.sh"
begin_results
cp .devs/cubellm .devs/cubellm-new
has() { [[ " ${STEPS:-tests long short} " == *" $1 "* ]]; }
export CUBELLM_TEST_RUNTIMES=cuda
if has long || has short; then start_model .devs/cubellm 300; else MODEL_PID=; fi
if has tests; then
  timeout "${OPS_TIMEOUT:-240}" .devs/ops-test --test-threads=8 ${OPS_FILTER:-attention} \
    > "$R/ops-test.log" 2>&1
  echo "rc=$?" >> "$R/ops-test.log"
  grep -h "test result\|rc=\|FAILED\|panicked" "$R/ops-test.log" | head
fi
if has model; then
  (cd crates/model && timeout "${MODEL_TIMEOUT:-240}" ../../.devs/model-test --test-threads=4 \
    ${MODEL_FILTER:-}) > "$R/model-test.log" 2>&1
  echo "rc=$?" >> "$R/model-test.log"
  grep -h "test result\|rc=\|FAILED\|panicked" "$R/model-test.log" | head
fi
[ -n "$MODEL_PID" ] && wait_model
echo "tests and model done at $(elapsed) s"
if has long; then
  OUT=$OUT/long LABELS=${LONG_LABELS:-base new} MODES=none ROUNDS=${LONG_ROUNDS:-2} PROMPT=32640 \
    BUDGET=${LONG_BUDGET:-150} bash dev/ab_device_run.sh | tail -3
fi
if has short; then
  OUT=$OUT/short LABELS="base new" MODES=${SHORT_MODES:-none w8a8} ROUNDS=${SHORT_ROUNDS:-2} \
    BUDGET=${SHORT_BUDGET:-150} bash dev/ab_device_run.sh | tail -5
fi
echo "A/B done at $(elapsed) s"
if has profile; then
  ensure_big_model .devs/cubellm "$R/setup6.log" 120 6
  build_trace_lib "$R/trace-build.log"
  for round in $(seq 1 "${PROF_ROUNDS:-1}"); do
    for label in ${PROF_LABELS:-base new}; do
      echo "$label round $round"
      PROMPT_LEN=32640 PROFILE_TIMEOUT=70 profile_layers ".devs/cubellm-$label" \
        "$R/prof-$label-$round" none
      pack_traces "$R/prof-$label-$round"
    done
  done
fi
echo "end at $(elapsed) s"
