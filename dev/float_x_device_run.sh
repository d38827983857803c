#!/usr/bin/env bash
# The 8-bit decode on the float activation (f16 tensor cores, `--quant-decode float`) against
# codes, on the GPU machine from the repository root, in one call of about 5 minutes: the
# kernel's CUDA tests (the model's shapes, gated launches of several waves, a long K on few
# tiles) and the model's float-decode test, then CUPTI per-kernel tables of the graph-replayed
# decode step (dev/profile) for W8A8 and FP8 on the float activation and on codes, bf16 beside
# them, on the 1.5B shape with 6 decoder layers (`make_hf_fixtures.py --big --big-layers 6`:
# the per-layer times of the 28-layer model at a quarter of its load time). MODES picks the
# profiled modes.
# PART=e2e instead builds the 28-layer model and runs the recorded end-to-end comparison
# (scripts/bench_e2e.sh beside the PyTorch peer, E2E_MODES, two runs each) into $OUT/r/e2e.jsonl.
# .devs/ as `dev/pack_device.sh` leaves it; results under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
if [ "${PART:-profile}" = e2e ]; then
  ensure_big_model $C $R/setup.log 240; echo "model rc=$?" >> $R/setup.log
  # What is left of the call's 10 minutes after the model.
  MODES=${E2E_MODES:-none w4a16 w4a16+head w8a8 w8a8+codes fp8 fp8+codes} RUNS=2 \
    timeout $((570 - SECONDS)) \
    bash scripts/bench_e2e.sh $C /tmp/big $R/e2e.jsonl 512 > $R/e2e.out 2> $R/e2e.err
  grep -h "decode\|peer" $R/e2e.out $R/e2e.err | tail -12
  exit 0
fi
start_model $C 150 6
build_trace_lib $R/trace-build.log
export CUBELLM_TEST_RUNTIMES=cuda
timeout 150 .devs/quant-test --test-threads=8 float_activations_gated_past_one_wave \
  float_activations_match_reference_at_model_shapes float_activations_long_k \
  > $R/quant-test.log 2>&1; echo "rc=$?" >> $R/quant-test.log
(cd crates/model && timeout 60 ../../.devs/model-test --test-threads=4 float_activation \
  --nocapture) > $R/model-test.log 2>&1; echo "rc=$?" >> $R/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -20
wait_model
for mode in ${MODES:-w8a8+float w8a8+codes fp8+float none fp8+codes}; do
  TRACE_LIB=/tmp/libkernel_trace.so timeout 60 bash dev/profile/decode_profile.sh $C /tmp/big6 \
    $R/prof "$mode" >> $R/profile.out 2>&1
  echo "== $mode"; grep -h "^per layer\|^step" "$R/prof/table_$mode.md" 2>/dev/null
done
rm -f $R/prof/copies_*.csv; gzip -f $R/prof/trace_*.csv 2>/dev/null
