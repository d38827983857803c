#!/usr/bin/env python3
"""PyTorch peers of `cli bench`: the same case names, timed the same way (many back-to-back
launches per sample, one synchronize, median of 9 samples after warm-up), printed as JSON lines.

    python3 scripts/bench_torch.py [--family norm] [--filter 4096x]

Runs on the GPU machine (torch with CUDA). Each family lists its cases in the order and with the
names that `cubellm::bench::<family>::cases` uses; `scripts/bench_table.py` joins them.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}


def time_launches(fn, target_s=0.02, samples=9):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 5e-7)
    iters = int(min(max(target_s / one, 3), 10000))
    for _ in range(min(max(iters, 3), 20)):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
    times.sort()
    return times[len(times) // 2]


def norm_cases():
    for dname in ["f16", "bf16", "f32"]:
        dt = DTYPES[dname]
        for rows, n in [(4096, 4096), (512, 1536), (1, 1536)]:
            x = torch.randn(rows, n, device="cuda", dtype=dt)
            r = torch.randn(rows, n, device="cuda", dtype=dt)
            w = torch.randn(n, device="cuda", dtype=dt)
            e = x.element_size()
            yield (f"rms_norm {rows}x{n}", dname, e * (2 * rows * n + n),
                   lambda x=x, w=w, n=n: F.rms_norm(x, (n,), w, 1e-6))
            yield (f"rms_norm_residual {rows}x{n}", dname, e * (4 * rows * n + n),
                   lambda x=x, r=r, w=w, n=n: F.rms_norm(x + r, (n,), w, 1e-6))


def sparse_cases():
    # Same grid and names as cubellm::bench::sparse: a random block mask with the exact count of
    # blocks, dense F.linear on the masked weight (cuBLAS) and F.linear on its BSR form.
    dt, b = torch.float16, 32
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in [(1024, 1024), (4096, 4096)]:
        w = torch.randn(n, k, device="cuda", dtype=dt, generator=gen)
        xs = {m: torch.randn(m, k, device="cuda", dtype=dt, generator=gen) for m in [16, 256, 4096]}
        for sp in [50, 70, 90]:
            nb = (n // b) * (k // b)
            keep = round((1 - sp / 100) * nb)
            mask = torch.zeros(nb, dtype=torch.bool, device="cuda")
            mask[torch.randperm(nb, device="cuda", generator=gen)[:keep]] = True
            mask = mask.view(n // b, k // b).repeat_interleave(b, 0).repeat_interleave(b, 1)
            ws = w * mask
            wb = ws.to_sparse_bsr((b, b))
            for m, x in xs.items():
                name = f"bsr_linear {n}x{k} s{sp} m{m}"
                nbytes = 2 * (m * k + keep * b * b + m * n)
                flops = 2 * m * keep * b * b
                yield (name, "f16", nbytes, lambda x=x, w=ws: F.linear(x, w), flops, "torch")
                try:
                    F.linear(x, wb)
                except Exception as e:  # report and go on: a missing BSR kernel is a result too
                    print(f"# torch_bsr {name}: {type(e).__name__}: {e}", flush=True)
                    continue
                yield (name, "f16", nbytes, lambda x=x, w=wb: F.linear(x, w), flops, "torch_bsr")


FAMILIES = {"norm": norm_cases, "sparse": sparse_cases}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default=None)
    ap.add_argument("--filter", default="")
    args = ap.parse_args()
    fams = [args.family] if args.family else list(FAMILIES)
    for fam in fams:
        for item in FAMILIES[fam]():
            name, dname, nbytes, fn = item[:4]
            flops = item[4] if len(item) > 4 else 0
            impl = item[5] if len(item) > 5 else "torch"
            if args.filter not in name:
                continue
            s = time_launches(fn)
            print(json.dumps({"impl": impl, "family": fam, "case": name, "dtype": dname,
                              "runtime": "cuda", "us": round(s * 1e6, 3), "bytes": nbytes,
                              "flops": flops, "gbps": round(nbytes / s / 1e9, 1),
                              "tflops": round(flops / s / 1e12, 2)}), flush=True)


if __name__ == "__main__":
    main()
