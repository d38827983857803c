#!/usr/bin/env bash
# Lab A/B of one binary under environment switches, on the GPU machine from the repository
# root: CUPTI per-layer tables of the 6-layer 1.5B-shape model per mode and variant, two rounds
# in alternating order, then (with BG=1) `bench-generate` on the 28-layer model per variant (or
# per variant of BG_VARIANTS), in BG_ROUNDS rounds of alternating order (default 1). Modes are
# read as dev/profile/decode_profile.sh reads them (w8a8+head quantizes the LM head too).
#   VARIANTS="base: nonorm:CUBELLM_LAB_NONORM=1" MODES="w8a8 fp8" [ROUNDS=2] bash dev/env_ab_prof_run.sh
# A variant is LABEL:ENV[,ENV...]; it runs .devs/cubellm-LABEL where that binary is there (another
# build), else .devs/cubellm as dev/pack_device.sh leaves it. PROMPTS (default 512) lists the
# prompt lengths of the tables (each table's directory then ends in _pLEN where there are
# several). Results under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
start_model $C 150 6
build_trace_lib $R/trace-build.log
wait_model
[ "${BG:-0}" = 1 ] && start_model $C 240
run_variant() { # label envs mode [binary]
  local envs=(${2//,/ }) out
  out=$( ([ ${#envs[@]} -gt 0 ] && export "${envs[@]}"; profile_layers ${4:-$C} $R/prof_$1 "$3") )
  echo "$1 $3: $(grep "^per layer" <<< "$out")"
}
in_round_order() { # round variant...: the variants, reversed in even rounds
  local round=$1; shift
  if [ $((round % 2)) = 0 ]; then printf '%s\n' "$@" | tac; else printf '%s\n' "$@"; fi
}
list=(${VARIANTS:-base:})
prompts=(${PROMPTS:-512})
for prompt in "${prompts[@]}"; do
  at=; [ ${#prompts[@]} -gt 1 ] && at=_p$prompt
  for round in $(seq 1 ${ROUNDS:-2}); do
    order=($(in_round_order $round "${list[@]}"))
    for v in "${order[@]}"; do
      for mode in ${MODES:-w8a8}; do
        label=${v%%:*}; envs=${v#*:}; bin=$C
        [ -x ".devs/cubellm-$label" ] && bin=.devs/cubellm-$label
        PROMPT_LEN=$prompt run_variant "${label}_r$round$at" "$envs" "$mode" "$bin"
      done
    done
  done
done
for d in $R/prof_*; do pack_traces $d; done
if [ "${BG:-0}" = 1 ]; then
  wait_model
  bg_list=(${BG_VARIANTS:-${list[@]}})
  rounds=${BG_ROUNDS:-1}
  for round in $(seq 1 $rounds); do
    order=($(in_round_order $round "${bg_list[@]}"))
    suffix=; [ "$rounds" -gt 1 ] && suffix=_r$round
    for v in "${order[@]}" ; do
      label=${v%%:*}; envs=${v#*:}; envs=(${envs//,/ })
      for mode in ${MODES:-w8a8}; do
        mapfile -t q < <(quant_args "$mode")
        out=$R/bg_${label}_$mode$suffix.out
        env "${envs[@]}" timeout 60 $C --runtime cuda bench-generate --model /tmp/big \
          --prompt-len 512 --new-tokens 128 --runs 2 --max-len 704 "${q[@]}" > $out 2>&1
        echo "$label$suffix $mode: $(grep -h decode $out | tail -1)"
      done
    done
  done
fi
