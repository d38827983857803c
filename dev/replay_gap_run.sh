#!/usr/bin/env bash
# The device's idle time between two replays of the decode step's graph, on the GPU machine from
# the repository root (about 4 minutes from a fresh start): the 28-layer 1.5B shape at a 512-token
# prompt under the CUPTI tracer, per weight format in MODES (default "none fp8+head w8a8+head"),
# then dev/profile/replay_gaps.py on each trace (the gap's median, the copies inside it and the
# registers of each kernel). .devs/cubellm as dev/pack_device.sh leaves it. Results under $OUT/r
# (r.tgz): p/table_MODE.md, p/gaps_MODE.txt, p/run_MODE.json and the gzipped traces. First, once
# the checkpoint is built (which may use the GPU), the synthetic of
# dev/add_controls/steps_per_graph.cu (one step per graph against several;
# steps_per_graph.txt), unless SYNTH=0.
#   MODES="none fp8+head" bash dev/replay_gap_run.sh
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
model_and_tracer $C 200
if [ "${SYNTH:-1}" = 1 ]; then
  nvcc -O3 -arch=sm_90a -o /tmp/steps_per_graph dev/add_controls/steps_per_graph.cu \
    > $R/steps_per_graph-build.log 2>&1 &&
    timeout 120 /tmp/steps_per_graph > $R/steps_per_graph.txt 2>&1
  cat $R/steps_per_graph-build.log $R/steps_per_graph.txt 2>/dev/null | tail -22
fi
for m in ${MODES:-none fp8+head w8a8+head}; do
  echo "== $m"
  PROFILE_TIMEOUT=90 NEW_TOKENS=${NEW_TOKENS:-96} profile_layers $C $R/p "$m" /tmp/big
  python3 dev/profile/replay_gaps.py "$R/p/trace_$m.csv" > "$R/p/gaps_$m.txt" 2>&1
  head -3 "$R/p/gaps_$m.txt"
  grep -o '"decode_tok_s":[0-9.]*' "$R/p/run_$m.json"
done
pack_traces $R/p
