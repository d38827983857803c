#!/usr/bin/env bash
# The attention and o in one launch, priced by a synthetic chain (dev/add_controls/fused_attention_o.cu),
# on the GPU machine from the repository root, one call of about a minute: the timing run
# ($OUT/r/fao.txt), then 2 rounds under the CUPTI kernel tracer (fao_trace.csv.gz, per-kernel
# medians in fao_kernels.txt). Results under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
build_trace_lib $R/trace-build.log
cu13=$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])')
nvcc -O3 -arch=sm_90a -o /tmp/fao dev/add_controls/fused_attention_o.cu > $R/fao-build.log 2>&1 || { cat $R/fao-build.log; exit 1; }
timeout 120 /tmp/fao > $R/fao.txt 2>&1; echo "rc=$?" >> $R/fao.txt
cat $R/fao.txt
LD_LIBRARY_PATH="$cu13/lib:${LD_LIBRARY_PATH:-}" FAO_ROUNDS=2 \
  CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT=$R/fao_trace.csv \
  timeout 120 /tmp/fao > $R/fao_traced.txt 2>&1
head -3 $R/fao_trace.csv
gzip -f $R/fao_trace.csv
