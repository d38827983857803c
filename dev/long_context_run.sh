#!/usr/bin/env bash
# One call on the GPU machine, from the repository root: the CUPTI table of the graph-replayed
# step at the end of a PROFILE_LEN-token prompt (default 32640) for each of PROFILE_MODES
# (default none), then the recorded end-to-end run at long contexts beside the peer
# (scripts/bench_e2e.sh at CONTEXTS, default 4096 16384 32768; MODES, default the four formats;
# RUNS, default 2). .devs/ as dev/pack_device.sh leaves it. Results under $OUT/r (r.tgz).
#   PROFILE_MODES="none w8a8" CONTEXTS="4096 32768" bash dev/long_context_run.sh
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
model_and_tracer $C 240
for mode in ${PROFILE_MODES:-none}; do
  echo "$mode: $(PROMPT_LEN=${PROFILE_LEN:-32640} PROFILE_TIMEOUT=120 \
    profile_layers $C $R/prof_long $mode /tmp/big)"
done
pack_traces $R/prof_long
MODES=${MODES:-"none w8a8 fp8 w4a16"} RUNS=${RUNS:-2} \
  bash scripts/bench_e2e.sh $C /tmp/big $R/e2e.jsonl ${CONTEXTS:-4096 16384 32768} \
  > $R/e2e.log 2>&1
echo "e2e rc=$?"
python3 - "$R/e2e.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["context"], r["weights"], "prefill", r["prefill_tok_s"], "decode", r["decode_tok_s"],
          "peer", r["peer"]["prefill_tok_s"], r["peer"]["decode_tok_s"])
PY
