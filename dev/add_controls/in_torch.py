"""CubeCL's generated f16 add and hand-written ones launched inside PyTorch's process (its
context, its caching allocator's tensors, its current stream, through the driver API), timed
interleaved with torch.add on the same operands: separates the kernels' code from the state of
the process that launches them (docs/investigations/add.md).

    python3 in_torch.py ours.ptx hand.ptx [launch_many.so]
"""
import ctypes
import sys

import torch

ROWS, COLS = 4096, 4096
SAMPLES, ITERS, ROUNDS = 3, 500, 4
SETS = 4


def main():
    ours_ptx, hand_ptx = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    a = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    b = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    o = torch.empty_like(a)
    want = a + b
    nv = ROWS * COLS // 8
    cu = ctypes.CDLL("libcuda.so.1")

    def load(path, name):
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        data = open(path, "rb").read() + b"\0"
        assert cu.cuModuleLoadData(ctypes.byref(mod), data) == 0, path
        assert cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()) == 0, name
        return fn

    ptrs = [ctypes.c_uint64(t.data_ptr()) for t in (a, b, o)]
    # CubeCL's kernel takes its scalars in a by-value info struct: {len, b_len}, 4 u32 of metadata.
    info = (ctypes.c_uint32 * 6)(nv, nv, nv, nv, nv, 0)
    n = ctypes.c_uint32(nv)

    def params(*args):
        return (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in args])

    ours_params = params(*ptrs, info)
    hand_params = params(*ptrs, n)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def launcher(fn, threads, p):
        grid = nv // threads

        def go():
            r = cu.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, stream, p, None)
            if r:
                raise RuntimeError(f"cuLaunchKernel {r}")
        return go

    ours = load(ours_ptx, "add_kernel_f_f16_n_8")
    nbytes = ctypes.c_size_t(a.numel() * 2)
    keep = []  # keeps every operand set (and its parameter block) alive

    def torch_set():
        ts = (a.clone(), b.clone(), torch.empty_like(o))
        keep.append(ts)
        return [ctypes.c_uint64(t.data_ptr()) for t in ts]

    def driver_set(alloc):
        bufs = []
        for _ in range(3):
            ptr = ctypes.c_uint64()
            assert alloc(ptr) == 0
            bufs.append(ptr)
        for t, ptr in zip((a, b), bufs):
            assert cu.cuMemcpyDtoD_v2(ptr, ctypes.c_uint64(t.data_ptr()), nbytes) == 0
        return bufs

    # Placement: the same kernel on fresh operand sets from each allocator (cudaMalloc through
    # torch's caching allocator, cuMemAlloc, cuMemAllocAsync: CubeCL's), several sets each.
    allocators = {
        "torch": torch_set,
        "cuMemAlloc": lambda: driver_set(lambda p: cu.cuMemAlloc_v2(ctypes.byref(p), nbytes)),
        "cuMemAllocAsync": lambda: driver_set(lambda p: cu.cuMemAllocAsync(ctypes.byref(p), nbytes, stream)),
    }
    # name -> (launch function, the output it writes)
    variants = {
        "torch.add": (lambda: torch.add(a, b, out=o), ptrs[2]),
        "cubecl PTX x512": (launcher(ours, 512, ours_params), ptrs[2]),
        "w32 x128 (hand)": (launcher(load(hand_ptx, "w32_128"), 128, hand_params), ptrs[2]),
        "w128 x128 (hand)": (launcher(load(hand_ptx, "w128_128"), 128, hand_params), ptrs[2]),
        "w128 x512 (hand)": (launcher(load(hand_ptx, "w128_512"), 512, hand_params), ptrs[2]),
    }
    for k in range(SETS):
        for alloc_name, alloc in allocators.items():
            bufs = alloc()
            torch.cuda.synchronize()
            p = params(*bufs, info)
            keep.append((bufs, p))
            variants[f"cubecl PTX x512, {alloc_name} set {k}"] = (launcher(ours, 512, p), bufs[2])
    # Launches queued by a C loop (as fast as the driver takes them), through a helper library:
    # these take the launch count.
    batched = set()
    if len(sys.argv) > 3:
        fast = ctypes.CDLL(sys.argv[3])

        def go_many(count):
            r = fast.launch_many(ours, count, nv // 512, 512, stream, ours_params)
            if r:
                raise RuntimeError(f"launch_many {r}")
        variants["cubecl PTX x512, C loop"] = (go_many, ptrs[2])
        batched.add("cubecl PTX x512, C loop")
    # Every variant's output against PyTorch's sum.
    got = torch.empty_like(o)
    for name, (go, out) in variants.items():
        assert cu.cuMemsetD16_v2(out, 0x7E00, ctypes.c_size_t(o.numel())) == 0  # f16 NaN
        go(1) if name in batched else go()
        assert cu.cuMemcpyDtoD_v2(ctypes.c_uint64(got.data_ptr()), out, nbytes) == 0
        torch.cuda.synchronize()
        assert torch.equal(got, want), name
    variants = {name: go for name, (go, _) in variants.items()}
    times = {k: [] for k in variants}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(variants)
    for rnd in range(ROUNDS):
        for name in names if rnd % 2 == 0 else names[::-1]:
            go = variants[name]
            many = go if name in batched else lambda count, go=go: [go() for _ in range(count)]
            many(100)
            torch.cuda.synchronize()
            for _ in range(SAMPLES):
                e0.record()
                many(ITERS)
                e1.record()
                e1.synchronize()
                times[name].append(e0.elapsed_time(e1) * 1000 / ITERS)
    for name, t in times.items():
        t.sort()
        print(f"in torch {name:42} median {t[len(t) // 2]:.3f} (min {t[0]:.3f} max {t[-1]:.3f}) us")
    for alloc_name in allocators:
        meds = sorted(sorted(t)[len(t) // 2] for n, t in times.items() if f", {alloc_name} set" in n)
        print(f"in torch placement {alloc_name:16} set medians " + " ".join(f"{m:.3f}" for m in meds))


if __name__ == "__main__":
    main()
