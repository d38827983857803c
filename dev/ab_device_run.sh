#!/usr/bin/env bash
# Same-call A/B of decode builds on the GPU machine, run from the repository root: every label
# runs `cubellm bench-generate` on the 1.5B shape (scripts/make_hf_fixtures.py --big, built here
# if /tmp/big is missing) for each weight format, the labels interleaved round by round so that
# drift within the call touches them alike. One machine's runs of one binary spread by 1-3%, so
# a change worth keeping has to beat that over the rounds, not in one run.
#
#   LABELS="main wip" MODES="w4a16" ROUNDS=3 BUDGET=480 bash dev/ab_device_run.sh
#
# Label L runs .devs/cubellm-L (.devs/cubellm-L.xz unpacked here) if present, else
# .devs/cubellm; BIN_L=M runs .devs/cubellm-M instead (two labels on one binary with other
# arguments); ENV_L (space-separated VAR=value words) sets its environment, for lab switches
# (`ENV_knob="CUBELLM_LAB_X=1"`), ARGS_L extra bench-generate arguments (`ARGS_head=--quant-lm-head`).
# MODES are --quant values or `none` (default: none w4a16), MODES_L a label's own,
# ROUNDS (2) the rounds, RUNS (2) the runs per bench-generate, PROMPT (512) and NEW (128) the
# prompt and new tokens. A run that would start after BUDGET seconds (480) is skipped, so the
# call ends within the device's limit. Writes $OUT/r/ab.jsonl (each line the bench's JSON with
# "ab_label" and "ab_round" added) and prints each run and then the median decode tok/s per
# label and format.
set -u
R=$OUT/r
mkdir -p "$R"
T0=$(date +%s)
elapsed() { echo $(($(date +%s) - T0)); }
source "$(dirname "$0")/device_setup.sh"
unpack_devs
C=.devs/cubellm
# The checkpoint's builder: any of the binaries where there is no unlabelled one.
B=$C
[ -x "$B" ] || B=$(ls .devs/cubellm-* | grep -v '\.xz$' | head -1)
ensure_big_model "$B" "$R/setup.log" 300
echo "setup done at $(elapsed) s"
labels=${LABELS:-main}
modes=${MODES:-none w4a16}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for label in $labels; do
    modesvar="MODES_$label"
    for mode in ${!modesvar:-$modes}; do
      if [ "$(elapsed)" -gt "${BUDGET:-480}" ]; then
        echo "skipped $label $mode round $round (budget)"
        continue
      fi
      bin=$C
      [ -x ".devs/cubellm-$label" ] && bin=".devs/cubellm-$label"
      binvar="BIN_$label"
      [ -n "${!binvar:-}" ] && bin=".devs/cubellm-${!binvar}"
      envvar="ENV_$label"
      argsvar="ARGS_$label"
      q=()
      [ "$mode" != none ] && q=(--quant "$mode")
      line=$(env ${!envvar:-} timeout 120 "$bin" --runtime cuda bench-generate --model /tmp/big \
        --prompt-len "${PROMPT:-512}" --new-tokens "${NEW:-128}" --runs "${RUNS:-2}" "${q[@]}" ${!argsvar:-} \
        2>> "$R/ab.err" | tail -1)
      python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["ab_label"]=sys.argv[2]; r["ab_round"]=int(sys.argv[3]); print(json.dumps(r))' \
        "$line" "$label" "$round" >> "$R/ab.jsonl" 2>> "$R/ab.err" ||
        echo "{\"ab_label\": \"$label\", \"ab_round\": $round, \"failed\": true}" >> "$R/ab.jsonl"
      echo "$label $mode round $round: $(tail -1 "$R/ab.jsonl" | grep -o '"decode_tok_s": [0-9.]*') ($(elapsed) s)"
    done
  done
done
python3 - "$R/ab.jsonl" <<'EOF'
import json, statistics, sys
runs = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "decode_tok_s" in r:
        runs.setdefault((r["ab_label"], str(r.get("weights"))), []).append(r["decode_tok_s"])
for (label, weights), v in sorted(runs.items()):
    print(f"{label:>12} {weights[:40]:<40} median {statistics.median(v):8.1f}  runs {v}")
EOF
