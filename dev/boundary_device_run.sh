#!/usr/bin/env bash
# Kernel boundaries (dev/add_controls/boundary.cu) beside the decode step's own kernels, on the
# GPU machine from the repository root, one call of about 4 minutes:
#   the synthetic decode-like chain (28 layers of five GEMV-like stages with the 1.5B step's
#   grids and weight bytes) under the CUPTI tracer, per shape and variant given in SYN (S,V
#   pairs, default "0,0 1,0 2,0 2,1"; files syn_S_V.*), each with its per-kernel table; then the CUPTI per-layer
#   tables of a 6-layer model of the 1.5B shape in MODES (default w8a8 fp8 w4a16 none) from
#   .devs/cubellm (as dev/pack_device.sh leaves it). Results under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
[ -x $C ] && start_model $C 150 6
build_trace_lib $R/trace-build.log
cu13=$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])')
nvcc -O3 -arch=sm_90a -o /tmp/boundary dev/add_controls/boundary.cu > $R/boundary-build.log 2>&1
for sv in ${SYN:-0,0 1,0 2,0 2,1}; do
  f=$R/syn_${sv/,/_}
  LD_LIBRARY_PATH="$cu13/lib:${LD_LIBRARY_PATH:-}" BOUNDARY_ONLY=$sv \
    CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT=$f.csv \
    timeout 60 /tmp/boundary > $f.txt 2>&1
  python3 dev/profile/decode_table.py $f.csv --markdown > $f.md 2>&1
  echo "== synthetic $sv"; grep -h "us a layer\|MISMATCH" $f.txt; grep -h "^step" $f.md
done
gzip -f $R/syn_*.csv
[ -x $C ] || exit 0
wait_model
for mode in ${MODES:-w8a8 fp8 w4a16 none}; do
  echo "== $mode"; profile_layers $C $R/prof "$mode"
done
pack_traces $R/prof
