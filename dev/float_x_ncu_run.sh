#!/usr/bin/env bash
# Why the float-activation gate-up streams its 27.5 MB at 1.7-1.8 TB/s where the codes path's
# gate-up and bf16's reach about 3: Nsight Compute on one decode-step gate-up launch of each
# (layer 3 of a 6-layer model of the 1.5B shape, inside the captured graph, caches as the step
# leaves them), on the GPU machine from the repository root, in one call of about 5 minutes:
#   $OUT/r/ncu_<kind>.txt   speed of light, memory, warp states, occupancy, launch, instructions
#   $OUT/r/sass_<kind>.txt  warp-stall samples per SASS line (dev/profile/sass_hotspots.py)
# for kind = float (`--quant-decode float`, `float_x_kernel`) and codes (`--quant-decode codes`,
# `gemm8_skinny_kernel`). The float path launches 4 float_x kernels per layer (qkv, o, gate-up,
# down) and the codes path 4 skinny ones, so launch 14 is layer 3's gate-up in both.
# .devs/ as `dev/pack_device.sh` leaves it; results under $OUT/r (r.tgz). The runs themselves
# are dev/kernel_ncu_run.sh's.
KERNELS="float:float_x_kernel:14:w8a8::--quant-decode,float \
codes:gemm8_skinny_kernel:14:w8a8::--quant-decode,codes" exec bash dev/kernel_ncu_run.sh
