#!/bin/bash
# CUDA C controls for the add investigation (docs/investigations/add.md; pdl.cu:
# docs/investigations/pdl.md). Run on the GPU machine from the repository root, with the lab
# binary in $LAB (default: target/release/lab; `cargo build --release -p cubellm-lab`), whose
# `addlab "add eager pattern"` case makes CubeCL compile its default f16 add. Needs nvcc and
# python3.
#   runtime_env.cu  - a hand-written f16 add timed eager under cudaMalloc / cudaMallocAsync
#                     (CubeCL's allocator), the legacy / a non-blocking stream (CubeCL's),
#                     a 320-byte parameter block, and launches paced by the host.
#   kernel_code.cu  - hand-written adds (4 x 32-bit or 1 x 128-bit accesses, 128 or 512 threads,
#                     CubeCL's 3-D index) beside the add kernel CubeCL generates, loaded from its
#                     PTX like CubeCL does, in one process; then again after a CUDA graph capture.
#   in_torch.py     - CubeCL's add and hand-written ones (hand_kernels.cu) launched inside
#                     PyTorch's process, interleaved with torch.add; also on operands from
#                     cuMemAllocAsync, and queued by a C loop (launch_many.c).
#   cache_hints.cu  - L2 prefetch-size (L2::128B / L2::256B), L1::no_allocate and .nc hints on
#                     the loads; in a loop of itself, after another add, and L2-resident.
#   pdl.cu          - programmatic dependent launch (wait only, trigger before/after the wait).
set -euo pipefail
LAB=${LAB:-target/release/lab}
T=$(mktemp -d)
export CUDARC_CUDA_VERSION=${CUDARC_CUDA_VERSION:-13000}
# The CUDA source CubeCL generates for the default f16 add, from its compilation log.
CUBECL_DEBUG_LOG=$T/cubecl.log "$LAB" --runtime cuda addlab "add eager pattern" > /dev/null 2>&1 || true
python3 - "$T" <<'PY'
import re, sys
t = sys.argv[1]
log = open(f"{t}/cubecl.log").read()
for src in re.findall(r"source:\n```cpp\n(.*?)```", log, re.S):
    if "add_kernel_f_f16_n_8" in src and "__launch_bounds__(512)" in src:
        src = "#include <cstdint>\n" + re.sub(r"^typedef .*int[0-9]*_t;\n", "", src, flags=re.M)
        open(f"{t}/ours.cu", "w").write(src)
        break
else:
    sys.exit("no 512-unit f16 add kernel in the CubeCL log")
PY
nvcc -ptx -arch=sm_90a -lineinfo -o $T/ours.ptx $T/ours.cu
nvcc -O3 -arch=sm_90 -o $T/runtime_env dev/add_controls/runtime_env.cu -lcuda
nvcc -O3 -arch=sm_90 -o $T/kernel_code dev/add_controls/kernel_code.cu -lcuda
[ -z "${KERNEL_CODE_ONLY:-}" ] && $T/runtime_env
$T/kernel_code $T/ours.ptx
ONLY=7,0 $T/kernel_code $T/ours.ptx
[ -n "${KERNEL_CODE_ONLY:-}" ] && exit 0
LOAD_LATE=1 $T/kernel_code $T/ours.ptx
nvcc -ptx -arch=sm_90a -o $T/hand.ptx dev/add_controls/hand_kernels.cu
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc)")")/include
gcc -O2 -shared -fPIC -I"$CUDA_INC" -o $T/launch_many.so dev/add_controls/launch_many.c -lcuda
python3 dev/add_controls/in_torch.py $T/ours.ptx $T/hand.ptx $T/launch_many.so
nvcc -O3 -arch=sm_90a -o $T/cache_hints dev/add_controls/cache_hints.cu
$T/cache_hints
nvcc -O3 -arch=sm_90a -o $T/pdl dev/add_controls/pdl.cu
$T/pdl
