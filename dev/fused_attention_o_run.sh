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
# Per kernel (attention variants by template arguments, stages by grid) and shape (the shapes
# run one after the other: split at the longest idle gap): median µs each adds to the step.
python3 - $R/fao_trace.csv > $R/fao_kernels.txt <<'PY'
import csv, collections, re, statistics, sys
rows = sorted((int(r[0]), int(r[1]), int(r[2]), r[11]) for r in list(csv.reader(open(sys.argv[1])))[1:])
cut = max((b[0] - a[1], i) for i, (a, b) in enumerate(zip(rows, rows[1:])))[1] + 1
for name, part in (("8-bit sizes", rows[:cut]), ("bf16 sizes", rows[cut:])):
    added, prev_end = collections.defaultdict(list), None
    for start, end, grid, kernel in part:
        m = re.search(r"attentionILi(\d+)ELi(\d+)E", kernel)
        key = (f"attention<{m[1]}, {m[2]}>" if m else "stage", grid)
        if prev_end is not None and start - prev_end < 20000:
            added[key].append((end - prev_end) / 1000)
        prev_end = end
    print(name, {k: round(statistics.median(v), 2) for k, v in sorted(added.items())})
PY
cat $R/fao_kernels.txt
gzip -f $R/fao_trace.csv
