#!/usr/bin/env python3
"""Compiles CUDA C++ sources as the CUDA runtime does on the device (NVRTC, then ptxas) on a
machine without a GPU, and prints each kernel's registers, spills and shared memory.

    python3 dev/cuda_compile/check.py DIR [--arch sm_90a] [--sass]

DIR holds `.cu` files, e.g. those the quant crate's `cuda_sources_build_for_sm90` test writes
with CUBELLM_CUDA_SOURCE_DIR=DIR. NVRTC, ptxas and the CUDA headers come from PyPI's
`nvidia-cuda-nvrtc-cu12`, `nvidia-cuda-nvcc-cu12`, `nvidia-cuda-runtime-cu12` and
`nvidia-cuda-cccl-cu12` (the CCCL headers that cooperative groups include, for the attention
kernels' `cp.async` barriers; see `dev/cuda_compile/README.md`). With --sass (PyPI's
`nvidia-cuda-nvdisasm`) each kernel's SASS is written beside its source and a count of its
instruction classes printed. Exits 1 if any source fails to compile or assemble, or, with
--sass, if a kernel issues a read-only (`.CONSTANT`) load of a parameter before its
`griddepcontrol.wait` that its source does not name in `cubellm.early_params`.
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys


# SASS opcodes counted with --sass: tensor cores, memory, conversions, barriers.
SASS_CLASSES = ["HMMA", "IMMA", "LDG", "LDS", "STS", "STG", "SHFL", "BAR", "PRMT", "F2FP", "I2F",
                "LOP3", "HFMA2", "FFMA"]


def nvidia_root():
    import nvidia  # the namespace package of the nvidia-cuda-* wheels

    return list(nvidia.__path__)[0]


def sass_counts(ptxas, cubin_from, arch):
    root = nvidia_root()
    nvdisasm = (glob.glob(os.path.join(root, "*", "bin", "nvdisasm")) or [None])[0]
    if nvdisasm is None:
        sys.exit("--sass needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    cubin = cubin_from[:-4] + ".cubin"
    subprocess.run([ptxas, f"-arch={arch}", cubin_from, "-o", cubin], check=True)
    sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True).stdout
    open(cubin_from[:-4] + ".sass", "w").write(sass)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    counts = {c: sum(1 for o in ops if o == c or o.startswith(c + "_")) for c in SASS_CLASSES}
    return (len(ops), counts, wide_loads_before_wait(sass), loads_after_trigger(sass),
            params_loaded_before_wait(sass))


def wide_loads_before_wait(sass):
    """16-byte global loads (`LDG`, `LDGSTS`) issued before the first `griddepcontrol.wait`
    (`ACQBULK`), or None where the kernel has no wait: a decode kernel's early loads, which ptxas
    may schedule after a bare wait."""
    lines = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
    for i, line in enumerate(lines):
        if re.search(r"\bACQBULK\b", line):
            return sum(1 for l in lines[:i] if re.search(r"\bLDG(STS)?\.E(\.\w+)*\.128\b", l))
    return None


PARAM_BASE = 0x210  # the first kernel parameter in the sm_90 constant bank 0


def params_loaded_before_wait(sass):
    """The kernel parameters (pointer positions, 0 first; '?' where the address was not traced
    back to one) that global loads read before the first `griddepcontrol.wait` (`ACQBULK`), or
    None where the kernel has no wait. Only weights, which no kernel writes, may be read there:
    a buffer that the kernel before writes is read stale. ptxas moves a read-only
    (`ld.global.nc`, SASS `.CONSTANT`) load above the wait when the PTX has it after."""
    lines = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
    wait = next((i for i, l in enumerate(lines) if re.search(r"\bACQBULK\b", l)), None)
    if wait is None:
        return None

    def origin(reg, before):
        # Back to the constant-bank load that set `reg` (through IMAD.WIDE / IADD3 / MOV and
        # their uniform forms).
        for j in range(before - 1, -1, -1):
            m = re.match(r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s+(.*)", lines[j])
            if not m:
                continue
            op, args = m.group(1), [a.strip().replace(".reuse", "") for a in m.group(2).split(",")]
            if not args or args[0] != reg:
                continue
            op = op[1:] if op.startswith("U") else op  # uniform datapath forms alike
            c = re.search(r"c\[0x0\]\[(0x[0-9a-f]+)\]", m.group(2))
            if op.startswith("LDC") and c:
                return (int(c.group(1), 16) - PARAM_BASE) // 8
            if op.startswith("IMAD.WIDE"):
                return origin(args[-1], j) if re.fullmatch(r"U?R\d+", args[-1]) else "?"
            if op.startswith(("IMAD.U32", "IMAD.MOV")) and args[1:3] == ["RZ", "RZ"]:
                return origin(args[3], j)  # a move through the multiplier: 0 · 0 + src
            if op.startswith(("IADD3", "MOV", "LEA")):
                regs = [a for a in args[1:] if re.fullmatch(r"U?R\d+", a)]
                return origin(regs[-1] if op.startswith("LEA") else regs[0], j) if regs else "?"
            return "?"
        return "?"

    found = {}
    for i, line in enumerate(lines[:wait]):
        m = re.search(r"\bLDG(?:STS)?\.E([.\w]*)\s.*\[(U?R\d+)(?:\.64)?", line)
        if m:
            param = origin(m.group(2), i)
            found[param] = found.get(param, False) or ".CONSTANT" in m.group(1)
    return found


def early_params(source):
    """The parameters a kernel that places its own wait names as read before it (the comment
    `cubellm.early_params i j ..`; empty without one): the patched CUDA runtime keeps
    `__restrict__`, so read-only loads, only on these."""
    m = re.search(r"cubellm\.early_params([ 0-9]*)", source)
    return {int(w) for w in m.group(1).split()} if m else set()


def loads_after_trigger(sass):
    """Global loads (`LDG` of any width) after the first `griddepcontrol.launch_dependents`
    (`PREEXIT`), or None where the kernel has none: in a decode GEMV, which signals once its
    weights are read, these are the epilogue's loads (scales, bias, residual), whose latency
    sits between the last product and the store unless ptxas issues them before the
    reductions."""
    lines = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
    for i, line in enumerate(lines):
        if re.search(r"\bPREEXIT\b", line):
            return sum(1 for l in lines[i:] if re.search(r"\bLDG\.E\b", l))
    return None


def toolkit():
    root = nvidia_root()
    nvrtc = glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so*"))
    ptxas = os.path.join(root, "cuda_nvcc", "bin", "ptxas")
    include = [os.path.join(root, p, "include") for p in ("cuda_runtime", "cuda_cccl")]
    if not nvrtc or not os.path.exists(ptxas) or not all(map(os.path.isdir, include)):
        sys.exit(f"the CUDA compiler packages are incomplete under {root}")
    return ctypes.CDLL(sorted(nvrtc)[0]), ptxas, include


def nvrtc_ptx(lib, source, name, arch, include):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source, name.encode(), 0, None, None):
        return None, "nvrtcCreateProgram failed"
    opts = [f"--gpu-architecture={arch}", "-lineinfo"] + [f"--include-path={i}" for i in include]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        return None, log.value.decode(errors="replace")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--sass", action="store_true")
    args = ap.parse_args()
    lib, ptxas, include = toolkit()
    sources = sorted(glob.glob(os.path.join(args.dir, "*.cu")))
    if not sources:
        sys.exit(f"no .cu files in {args.dir}")
    failed = 0
    for path in sources:
        name = os.path.basename(path)
        # The source's own folder too, for the headers beside it.
        ptx, err = nvrtc_ptx(lib, open(path, "rb").read(), name, args.arch,
                             include + [os.path.dirname(os.path.abspath(path))])
        if err is None:
            ptx_path = path[:-3] + ".ptx"
            open(ptx_path, "wb").write(ptx)
            r = subprocess.run([ptxas, f"-arch={args.arch}", "-v", ptx_path, "-o", os.devnull],
                               capture_output=True, text=True)
            err = None if r.returncode == 0 else (r.stdout + r.stderr)
            info = r.stdout + r.stderr
        if err is not None:
            failed += 1
            print(f"{name}: FAILED\n{err[:3000]}")
            continue
        regs = re.search(r"Used (\d+) registers", info)
        spill = re.search(r"(\d+) bytes spill stores", info)
        smem = re.search(r"(\d+) bytes smem", info)
        print(f"{name:44s} ok  {regs.group(1) if regs else '?':>4} registers, "
              f"{spill.group(1) if spill else '?'} B spilled, "
              f"{smem.group(1) if smem else '0'} B static shared")
        if args.sass:
            total, counts, early, late, params = sass_counts(ptxas, ptx_path, args.arch)
            print(f"    {total} instructions: " + ", ".join(
                f"{c} {n}" for c, n in counts.items() if n))
            if early is not None:
                print(f"    {early} 16-byte loads before the first griddepcontrol.wait (ACQBULK)")
            if params is not None:
                print(f"    parameters read before the wait: {sorted(params, key=str)}")
                early_ok = early_params(open(path).read())
                stray = sorted((p for p, nc in params.items() if nc and p not in early_ok),
                               key=str)
                if stray:
                    # A read-only load above the wait of a buffer the kernel before may write.
                    failed += 1
                    print(f"{name}: FAILED: read-only loads of parameters {stray} before "
                          f"griddepcontrol.wait, not named in cubellm.early_params")
            if late is not None:
                print(f"    {late} global loads after griddepcontrol.launch_dependents (PREEXIT)")
    print(f"{len(sources) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
