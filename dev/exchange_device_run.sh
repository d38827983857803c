#!/usr/bin/env bash
# The clustered decode attention's two hand-overs of its split partials (global memory and the
# cluster barrier's release, or `st.async` into the owning cube's shared memory:
# crates/ops/src/attention/cluster_merge.rs), on the GPU machine from the repository root, one
# binary under the lab switch CUBELLM_LAB_EXCHANGE (0 = global memory), built with
# dev/attempts/cluster-exchange-lab-switch.patch applied (the library keeps the exchange only):
#   bash dev/exchange_device_run.sh
# runs the attention's CUDA tests and the model's device tests (the transformers fixtures) with
# the exchange, then `bench-generate` on the 28-layer model for both hand-overs, then CUPTI
# per-layer tables of the 6-layer 1.5B-shape model (MODES, default bf16 and W8A8) for both (two
# rounds each, in alternating order). .devs/ as dev/pack_device.sh leaves it. Results under
# $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
(ensure_big_model $C $R/setup.log 240 && ensure_big_model $C $R/setup6.log 150 6
  echo "models rc=$?" >> $R/setup.log) &
MODEL_PID=$!
build_trace_lib $R/trace-build.log
export CUBELLM_TEST_RUNTIMES=cuda
timeout 200 .devs/ops-test --test-threads=8 attention > $R/ops-test.log 2>&1
echo "rc=$?" >> $R/ops-test.log
(cd crates/model && timeout 200 ../../.devs/model-test --test-threads=4) > $R/model-test.log 2>&1
echo "rc=$?" >> $R/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
wait_model
variants=(base:CUBELLM_LAB_EXCHANGE=0 exchange:CUBELLM_LAB_EXCHANGE=1)
for round in 1 2; do
  order=("${variants[@]}")
  [ $round = 2 ] && order=("${variants[1]}" "${variants[0]}")
  for v in "${order[@]}"; do
    for mode in ${MODES:-none w8a8}; do
      q=(); [ "$mode" != none ] && q=(--quant "$mode")
      env "${v#*:}" timeout 60 $C --runtime cuda bench-generate --model /tmp/big \
        --prompt-len 512 --new-tokens 128 --runs 2 --max-len 704 "${q[@]}" \
        > $R/bg_${v%%:*}_${mode}_r$round.out 2>&1
      echo "${v%%:*} r$round $mode: $(grep -h decode $R/bg_${v%%:*}_${mode}_r$round.out | tail -1)"
    done
  done
done
for round in 1 2; do
  order=("${variants[@]}")
  [ $round = 2 ] && order=("${variants[1]}" "${variants[0]}")
  for v in "${order[@]}"; do
    for mode in ${MODES:-none w8a8}; do
      out=$(export "${v#*:}"; profile_layers $C $R/prof_${v%%:*}_r$round "$mode")
      echo "${v%%:*} r$round $mode: $(grep "^per layer" <<< "$out")"
    done
  done
done
for d in $R/prof_*; do pack_traces $d; done
