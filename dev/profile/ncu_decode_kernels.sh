#!/usr/bin/env bash
# Nsight Compute details of single decode-step kernels on the GPU machine, inside the captured
# graph (`--graph-profiling node`, caches flushed before each profiled kernel, so weights come
# from DRAM): speed of light, memory workload, warp stall reasons, occupancy, launch shape,
# instruction counts and mix.
#   bash dev/profile/ncu_decode_kernels.sh CLI MODEL_DIR OUT_DIR MODE KERNEL_REGEX [SKIP] [COUNT]
# MODE is a --quant value or `none`; SKIP/COUNT (4/4) pick the launches (4 skips layer 0's four
# projections when the regex matches only the projection kernel). The prompt is 32 tokens, so
# that prefill runs the tiled kernels and the first matching launches are the decode step's.
set -u
cli=$1 model=$2 out=$3 mode=$4 regex=$5 skip=${6:-4} count=${7:-4}
mkdir -p "$out"
q=(); [ "$mode" != none ] && q=(--quant "$mode")
ncu --graph-profiling node --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SchedulerStats \
  --section InstructionStats --section ComputeWorkloadAnalysis --print-details all \
  "$cli" --runtime cuda bench-generate --model "$model" --prompt-len 32 --new-tokens 4 --runs 1 \
  "${q[@]}" > "$out/ncu_$mode.txt" 2> "$out/ncu_$mode.err"
echo "ncu $mode $regex: rc=$? ($(grep -c 'Duration' "$out/ncu_$mode.txt") kernels)"
