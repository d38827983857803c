#!/usr/bin/env bash
# A synthetic decode chain of dev/add_controls (SOURCE.cu: fused_attention_o, fused_mlp) built
# and run on the GPU machine from the repository root, one call of about a minute: the timing
# run ($OUT/r/PREFIX.txt), then 2 rounds (ROUNDS_ENV=2) under the CUPTI kernel tracer
# (PREFIX_trace.csv.gz, per-kernel medians in PREFIX_kernels.txt). Results under $OUT/r (r.tgz).
#   bash dev/synthetic_chain_run.sh SOURCE PREFIX ROUNDS_ENV
set -u
src=$1 prefix=$2 rounds_env=$3
source dev/device_setup.sh; begin_results
build_trace_lib $R/trace-build.log
cu13=$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])')
bin=/tmp/$prefix
nvcc -O3 -arch=sm_90a -o $bin dev/add_controls/$src.cu > $R/$prefix-build.log 2>&1 || { cat $R/$prefix-build.log; exit 1; }
timeout 150 $bin > $R/$prefix.txt 2>&1; echo "rc=$?" >> $R/$prefix.txt
cat $R/$prefix.txt
env LD_LIBRARY_PATH="$cu13/lib:${LD_LIBRARY_PATH:-}" "$rounds_env=2" \
  CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT=$R/${prefix}_trace.csv \
  timeout 150 $bin > $R/${prefix}_traced.txt 2>&1
# Per kernel (name and template arguments, and grid) and shape (the shapes run one after the
# other: split at the longest idle gap): median µs each adds to the step.
python3 - $R/${prefix}_trace.csv > $R/${prefix}_kernels.txt <<'PY'
import csv, collections, re, statistics, sys
rows = sorted((int(r[0]), int(r[1]), int(r[2]), r[11]) for r in list(csv.reader(open(sys.argv[1])))[1:])
cut = max((b[0] - a[1], i) for i, (a, b) in enumerate(zip(rows, rows[1:])))[1] + 1
def kernel_key(mangled, grid):
    m = re.match(r"_Z(\d+)(\w+)", mangled)
    if not m:
        return (mangled, grid)
    name, rest = m[2][:int(m[1])], m[2][int(m[1]):]
    args = re.findall(r"Li(\d+)E", rest.split("Ev")[0]) if rest.startswith("I") else []
    return (f"{name}<{', '.join(args)}>" if args else name, grid)
for name, part in (("8-bit sizes", rows[:cut]), ("bf16 sizes", rows[cut:])):
    added, prev_end = collections.defaultdict(list), None
    for start, end, grid, kernel in part:
        if prev_end is not None and start - prev_end < 20000:
            added[kernel_key(kernel, grid)].append((end - prev_end) / 1000)
        prev_end = end
    print(name, {k: round(statistics.median(v), 2) for k, v in sorted(added.items())})
PY
cat $R/${prefix}_kernels.txt
gzip -f $R/${prefix}_trace.csv
