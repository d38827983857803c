#!/usr/bin/env bash
# Why the float-activation gate-up streams its 27.5 MB at 1.7-1.8 TB/s where the codes path's
# gate-up and bf16's reach about 3: Nsight Compute on one decode-step gate-up launch of each
# (layer 3 of a 6-layer model of the 1.5B shape, inside the captured graph, caches as the step
# leaves them), on the GPU machine from the repository root, in one call of about 5 minutes:
#   $OUT/r/ncu_<kind>.txt   speed of light, memory, warp states, occupancy, launch, instructions
#   $OUT/r/sass_<kind>.txt  warp-stall samples per SASS line (dev/profile/sass_hotspots.py)
# for kind = float (W8A8's default decode, `float_x_kernel`) and codes (`--quant-decode codes`,
# `gemm8_skinny_kernel`). The float path launches 4 float_x kernels per layer (qkv, o, gate-up,
# down) and the codes path 4 skinny ones, so launch 14 is layer 3's gate-up in both.
# .devs/ as `dev/pack_device.sh` leaves it; results under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
ensure_big_model $C $R/setup.log 150 6; echo "model rc=$?" >> $R/setup.log
for kind in float codes; do
  case $kind in
    float) regex=float_x_kernel ;;
    codes) regex=gemm8_skinny_kernel ;;
  esac
  run=("$C" --runtime cuda bench-generate --model /tmp/big6 --prompt-len 512 --new-tokens 4
       --runs 1 --quant w8a8 --quant-decode "$kind")
  timeout 150 ncu --graph-profiling node --cache-control none --clock-control none \
    --kernel-name "regex:$regex" --launch-skip 14 --launch-count 1 --set full \
    --import-source no --warp-sampling-interval 0 -o "$R/ncu_$kind" "${run[@]}" \
    > "$R/ncu_$kind.log" 2>&1
  echo "ncu $kind rc=$?"
  ncu -i "$R/ncu_$kind.ncu-rep" --print-details all > "$R/ncu_$kind.txt" 2>&1
  ncu -i "$R/ncu_$kind.ncu-rep" --page source --csv --print-source sass > "$R/sass_$kind.csv" 2>&1
  python3 dev/profile/sass_hotspots.py "$R/sass_$kind.csv" > "$R/sass_$kind.txt" 2>&1
  grep -h "Duration\|DRAM Throughput\|Registers Per\|Achieved Occupancy\|Block Limit" \
    "$R/ncu_$kind.txt" | head -12
  rm -f "$R/sass_$kind.csv"
done
