#!/usr/bin/env bash
# Profiles the graph-replayed decode step of `cubellm bench-generate` on the GPU machine, per
# weight format: a CUPTI kernel trace of the real replays (times, gaps) and, with NCU=1, one
# replay under Nsight Compute for the DRAM bytes of each kernel; then the per-kernel table.
#
#   dev/profile/decode_profile.sh CLI MODEL_DIR OUT_DIR [modes...]     (modes: none w8a8 fp8 w4a16)
#
# The 8-bit formats decode as the CLI's default (`--quant-decode auto`: the float activation on
# the SIMT cores); a mode with `+codes` (w8a8+codes, fp8+codes) decodes on quantized activations
# (--quant-decode codes), one with `+float` on the float activation through f16 tensor cores
# (with `+float-simt` the default explicitly), one with `+head` quantizes the LM head too
# (--quant-lm-head).
#
# CLI is a cubellm binary (or the `cli` binary of builds before commit 533fe89: same flags); libkernel_trace.so is looked for
# beside this script or in $TRACE_LIB (build: see kernel_trace.c). PROMPT_LEN (512) and
# NEW_TOKENS (64) set the run; the cache holds PROMPT_LEN + NEW_TOKENS + 64 positions.
set -uo pipefail
cli=$1 model=$2 out=$3
shift 3
modes=${*:-none}
here=$(cd "$(dirname "$0")" && pwd)
# quant_args: a mode's flags (the same reading as the dev/*_run.sh scripts').
source "$here/../device_setup.sh"
lib=${TRACE_LIB:-$here/libkernel_trace.so}
cu13=$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])' 2>/dev/null)
[ -n "$cu13" ] && export LD_LIBRARY_PATH="$cu13/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
args=(--runtime cuda bench-generate --model "$model" --prompt-len "${PROMPT_LEN:-512}"
      --new-tokens "${NEW_TOKENS:-64}" --runs 1)
for mode in $modes; do
  mapfile -t q < <(quant_args "$mode")
  CUDA_INJECTION64_PATH=$lib KERNEL_TRACE_OUT="$out/trace_$mode.csv" \
    KERNEL_TRACE_COPIES="$out/copies_$mode.csv" \
    "$cli" "${args[@]}" "${q[@]}" > "$out/run_$mode.json" 2> "$out/run_$mode.log"
  ncu_arg=()
  if [ "${NCU:-0}" = 1 ]; then
    read -r _ skip _ count _ < <(python3 "$here/decode_table.py" "$out/trace_$mode.csv" --skip-info)
    timeout "${NCU_TIMEOUT:-300}" ncu --graph-profiling node --cache-control none --clock-control none \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
      --launch-skip "$skip" --launch-count "$count" --csv \
      "$cli" "${args[@]}" "${q[@]}" > "$out/ncu_$mode.csv" 2> "$out/ncu_$mode.log"
    ncu_arg=(--ncu "$out/ncu_$mode.csv")
  fi
  echo "== $mode"
  python3 "$here/decode_table.py" "$out/trace_$mode.csv" "${ncu_arg[@]}" \
    --json "$out/table_$mode.json" --markdown > "$out/table_$mode.md"
  tail -3 "$out/table_$mode.md"
done
