#!/usr/bin/env bash
# Nsight Compute on single decode-step kernels inside the captured graph (layer 3 of a 6-layer
# model of the 1.5B shape, caches as the step leaves them), on the GPU machine from the
# repository root: per entry of KERNELS ("label:regex:launches-to-skip:quant-mode[:ENV=v[:FLAGS]]",
# FLAGS extra `bench-generate` flags with commas for spaces, e.g. `--quant-decode,codes`),
#   $OUT/r/ncu_<label>.txt   speed of light, memory, warp states, occupancy, launch, instructions
#   $OUT/r/sass_<label>.txt  warp-stall samples per SASS line (dev/profile/sass_hotspots.py)
# Default: the decode attention (one launch a layer: skip 3) in bf16, and the SIMT 8-bit
# gate-up (four launches a layer: skip 14) in W8A8. .devs/ as dev/pack_device.sh leaves it.
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
ensure_big_model $C $R/setup.log 150 6; echo "model rc=$?" >> $R/setup.log
for entry in ${KERNELS:-attention:split_kv_mma_cluster:3:none gateup8:float_x_simt_kernel:14:w8a8}; do
  IFS=: read -r label regex skip mode envs flags <<< "$entry"
  q=(); [ "$mode" != none ] && q=(--quant "$mode")
  [ -n "$flags" ] && q+=(${flags//,/ })
  run=("$C" --runtime cuda bench-generate --model /tmp/big6 --prompt-len 512 --new-tokens 4
       --runs 1 "${q[@]}")
  env $envs timeout 150 ncu --graph-profiling node --cache-control none --clock-control none \
    --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 --set full \
    --import-source no --warp-sampling-interval 0 -o "$R/ncu_$label" "${run[@]}" \
    > "$R/ncu_$label.log" 2>&1
  echo "ncu $label rc=$?"
  ncu -i "$R/ncu_$label.ncu-rep" --print-details all > "$R/ncu_$label.txt" 2>&1
  ncu -i "$R/ncu_$label.ncu-rep" --page source --csv --print-source sass > "$R/sass_$label.csv" 2>&1
  python3 dev/profile/sass_hotspots.py "$R/sass_$label.csv" > "$R/sass_$label.txt" 2>&1
  grep -h "Duration\|DRAM Throughput\|Registers Per\|Achieved Occupancy" "$R/ncu_$label.txt" | head -8
  rm -f "$R/sass_$label.csv" "$R/ncu_$label.ncu-rep"
done
