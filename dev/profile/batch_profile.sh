#!/usr/bin/env bash
# Per-kernel table of the graph-replayed batched decode step (`bench-generate --batch N`) on the
# GPU machine, from a CUPTI kernel trace (kernel_trace.c, built here from the CUDA headers and
# libcupti that PyTorch's wheels ship).
#   bash dev/profile/batch_profile.sh CLI MODEL_DIR OUT_DIR [N...]
set -uo pipefail
cli=$1 model=$2 out=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
cu13=$(python3 -c 'import nvidia.cu13 as m; print(list(m.__path__)[0])' 2>/dev/null)
inc=$(python3 -c 'import nvidia.cuda_runtime as m; print(list(m.__path__)[0])' 2>/dev/null)
mkdir -p "$out"
gcc -O2 -shared -fPIC -I"$cu13/include" -I/usr/local/cuda/include "$here/kernel_trace.c" \
  -L"$cu13/lib" -l:libcupti.so.13 -o /tmp/libkernel_trace.so 2> "$out/build.log" || exit 1
export LD_LIBRARY_PATH="$cu13/lib:${LD_LIBRARY_PATH:-}"
for n in ${*:-16}; do
  CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT="$out/trace_b$n.csv" \
    "$cli" --runtime cuda bench-generate --model "$model" --prompt-len 512 --new-tokens 64 \
    --runs 1 --batch "$n" > "$out/run_b$n.json" 2> "$out/run_b$n.log"
  python3 "$here/decode_table.py" "$out/trace_b$n.csv" --markdown > "$out/table_b$n.md"
done
