#!/usr/bin/env bash
# A synthetic decode chain of dev/add_controls (SOURCE.cu: fused_attention_o, fused_mlp,
# fused_qkv_attention, l2_persist, long_attention) built and run on the GPU machine from the
# repository root, one call of about a minute: the timing run ($OUT/r/PREFIX.txt), then 2
# rounds (ROUNDS_ENV=2) under the CUPTI kernel tracer (PREFIX_trace.csv.gz, per-graph kernel
# medians in PREFIX_kernels.txt). Results under $OUT/r (r.tgz).
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
# Per graph (the variants' graphs in the order they were captured: shape by shape, each
# shape's variants in the order the timing run prints them) and kernel (name and template
# arguments, and grid): median µs each adds to the step; kernels launched outside a graph: their
# median durations.
python3 - $R/${prefix}_trace.csv > $R/${prefix}_kernels.txt <<'PY'
import csv, collections, re, statistics, sys
rows = sorted((int(r[0]), int(r[1]), int(r[2]), int(r[9]), r[11]) for r in list(csv.reader(open(sys.argv[1])))[1:])
def kernel_key(mangled, grid):
    m = re.match(r"_Z(\d+)(\w+)", mangled)
    if not m:
        return (mangled, grid)
    name, rest = m[2][:int(m[1])], m[2][int(m[1]):]
    args = re.findall(r"Li(\d+)E", rest.split("Ev")[0]) if rest.startswith("I") else []
    return (f"{name}<{', '.join(args)}>" if args else name, grid)
loose = collections.defaultdict(list)
for start, end, grid, graph, kernel in rows:
    if graph == 0:
        loose[kernel_key(kernel, grid)].append((end - start) / 1000)
if loose:
    print("outside graphs (duration)", {k: round(statistics.median(v), 2) for k, v in sorted(loose.items())})
for n, graph in enumerate(sorted({r[3] for r in rows} - {0})):
    added, prev_end = collections.defaultdict(list), None
    for start, end, grid, g, kernel in rows:
        if g != graph:
            continue
        if prev_end is not None and start - prev_end < 20000:
            added[kernel_key(kernel, grid)].append((end - prev_end) / 1000)
        prev_end = end
    print(f"graph {n + 1}", {k: round(statistics.median(v), 2) for k, v in sorted(added.items())})
PY
cat $R/${prefix}_kernels.txt
gzip -f $R/${prefix}_trace.csv
