#!/usr/bin/env bash
# Lab A/B, on a binary built with dev/attempts/qkv-early-trigger.patch applied (its
# CUBELLM_LAB_QKV_TRIGGER switch): the bf16 qkv GEMV (the normed, ungated one) signalling
# `griddepcontrol.launch_dependents` at its start, so that the decode attention's 16 cubes
# launch and queue their older keys while qkv streams, against signalling after its weight
# loop. On the GPU machine from the repository root, about 5 minutes: bf16 end to end on the
# 28-layer 1.5B shape, three alternating rounds, then one CUPTI table of each.
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
ensure_big_model $C $R/setup.log 240; echo "model rc=$?" >> $R/setup.log
build_trace_lib $R/trace-build.log
for round in 1 2 3; do
  for v in 0 1; do
    CUBELLM_LAB_QKV_TRIGGER=$v timeout 60 $C --runtime cuda bench-generate --model /tmp/big \
      --prompt-len 512 --new-tokens 128 --runs 2 > $R/ab_${v}_$round.json 2> $R/ab_${v}_$round.log
    echo "trigger=$v round $round: $(grep -o 'decode [0-9.]* tok/s' $R/ab_${v}_$round.log)"
  done
done
for v in 0 1; do
  CUBELLM_LAB_QKV_TRIGGER=$v TRACE_LIB=/tmp/libkernel_trace.so timeout 90 \
    bash dev/profile/decode_profile.sh $C /tmp/big $R/prof_$v none >> $R/profile.out 2>&1
  echo "== trigger=$v"; grep -h "^per layer\|^step" "$R/prof_$v/table_none.md" 2>/dev/null
done
rm -f $R/prof_*/copies_*.csv $R/prof_*/trace_*.csv
