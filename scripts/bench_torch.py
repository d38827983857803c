#!/usr/bin/env python3
"""PyTorch peers of `cubellm bench` and of the lab's `lab addlab`: the same case names, timed the
same way (many back-to-back launches per sample, one synchronize, median of 9 samples after
warm-up), printed as JSON lines.

    python3 scripts/bench_torch.py [--family norm] [--filter 4096x]

Runs on the GPU machine (torch with CUDA). Each family lists its cases in the order and with the
names that `bench::<family>::cases` (crates/bench; `lab::addlab::cases` in dev/lab for addlab)
uses; `scripts/bench_table.py` joins them.
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}

M64 = (1 << 64) - 1
LCG_A, LCG_C = 6364136223846793005, 1442695040888963407


def _signed(x):
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def cubellm_randn(n, seed, device="cuda"):
    """The values of `bench::randn(n, seed)` in crates/bench (same LCG, same Box-Muller, in f64,
    then f32), with the LCG's states built by jump-ahead so that it runs on the GPU."""
    draws = n + (n & 1)
    first = ((seed * LCG_A + LCG_C) * LCG_A + LCG_C) & M64
    states = torch.tensor([_signed(first)], dtype=torch.int64, device=device)
    a, c = LCG_A, LCG_C  # the map of len(states) steps
    while states.numel() < draws:
        states = torch.cat([states, states * _signed(a) + _signed(c)])
        a, c = (a * a) & M64, (a * c + c) & M64
    u = ((states[:draws] >> 11) & ((1 << 53) - 1)).double().add_(0.5).div_(2.0 ** 53)
    r, t = torch.sqrt(-2.0 * torch.log(u[0::2])), 2.0 * math.pi * u[1::2]
    return torch.stack([r * torch.cos(t), r * torch.sin(t)], dim=1).flatten()[:n].float()


def cubellm_randn_slow(n, seed):
    """The same values, one by one (checks `cubellm_randn`)."""
    state, out = (seed * LCG_A + LCG_C) & M64, []

    def uniform():
        nonlocal state
        state = (state * LCG_A + LCG_C) & M64
        return ((state >> 11) + 0.5) / 2.0 ** 53
    while len(out) < n:
        r, t = math.sqrt(-2.0 * math.log(uniform())), 2.0 * math.pi * uniform()
        out += [r * math.cos(t), r * math.sin(t)]
    return torch.tensor(out[:n], dtype=torch.float32)


MAX_ITERS = 20000


def time_launches(fn, target_s=0.02, samples=9):
    """(median, steady) seconds per launch, as bench::time_launches (crates/bench): samples of
    `iters` launches and one sync; `steady` from the difference between `iters` and `iters // 2`."""
    # Calibrated on a batch doubled until it runs for a tenth of the target, as
    # bench::calibrate does (one launch + sync measures the sync's round trip).
    fn()
    torch.cuda.synchronize()
    batch = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if elapsed >= target_s / 10 or batch >= MAX_ITERS:
            break
        batch *= 2
    one = max(elapsed / batch, 1e-9)
    iters = max(int(min(max(target_s / one, 3), MAX_ITERS)), 2)
    for _ in range(min(iters, 20)):
        fn()
    torch.cuda.synchronize()

    def timed(n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    half = iters // 2
    full, steady = [], []
    for _ in range(samples):
        t_half = timed(half)
        t_full = timed(iters)
        full.append(t_full / iters)
        steady.append(max(t_full - t_half, 0.0) / (iters - half))
    full.sort()
    steady.sort()
    return full[len(full) // 2], steady[len(steady) // 2]


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
    # Same grid and names as bench::sparse: a random block mask with the exact count of
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


def rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def core_cases():
    for dname in ["f16", "bf16", "f32"]:
        dt = DTYPES[dname]
        e = torch.empty((), dtype=dt).element_size()
        for rows, n in [(4096, 4096), (1, 8960)]:
            a = torch.randn(rows, n, device="cuda", dtype=dt)
            b = torch.randn(rows, n, device="cuda", dtype=dt)
            yield (f"add {rows}x{n}", dname, e * 3 * rows * n, lambda a=a, b=b: a + b)
            yield (f"swiglu {rows}x{n}", dname, e * 3 * rows * n, lambda a=a, b=b: F.silu(a) * b)
            yield (f"softmax {rows}x{n}", dname, e * 2 * rows * n, lambda a=a: torch.softmax(a, -1))
        inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
        for t, h in [(4096, 32), (512, 12), (1, 12)]:
            x = torch.randn(t, h, 128, device="cuda", dtype=dt)
            f = torch.arange(t, device="cuda").float()[:, None] * inv[None]
            emb = torch.cat((f, f), -1)
            cos, sin = emb.cos().to(dt)[:, None], emb.sin().to(dt)[:, None]
            yield (f"rope {t}x{h}x128", dname, e * 2 * t * h * 128 + 4 * t * 128,
                   lambda x=x, cos=cos, sin=sin: x * cos + rotate_half(x) * sin)
        for s, heads in [(4096, 32), (512, 12)]:
            hid = heads * 128
            x = torch.randn(1, s, hid, device="cuda", dtype=dt)
            w = torch.randn(hid, device="cuda", dtype=dt)
            cs = torch.randn(s, 128, device="cuda", dtype=dt)[None, :, None]

            def fused(x=x, w=w, cs=cs, s=s, heads=heads, hid=hid):
                y = F.rms_norm(x, (hid,), w, 1e-6).view(1, s, heads, 128)
                return y * cs + rotate_half(y) * cs
            yield (f"fused_rmsnorm_rope {s}x{hid}", dname, e * (2 * s * hid + 2 * s * 128 + hid), fused)
        table = torch.randn(151936, 1536, device="cuda", dtype=dt)
        for t in [512, 1]:
            ids = (torch.arange(t, device="cuda") * 97) % 151936
            yield (f"embedding {t}x1536", dname, e * 2 * t * 1536, lambda ids=ids, table=table: F.embedding(ids, table))
        logits = torch.randn(1, 151936, device="cuda", dtype=dt)
        yield ("argmax 1x151936", dname, e * 151936, lambda l=logits: torch.argmax(l, -1))


MODEL_SHAPES = [("qkv", 1536, 2048), ("o", 1536, 1536), ("gate_up", 1536, 17920),
                ("down", 8960, 1536), ("lm_head", 1536, 151936)]


def matmul_cases():
    for dname in ["bf16", "f16"]:
        dt = DTYPES[dname]
        e = torch.empty((), dtype=dt).element_size()

        def case(name, m, k, n):
            x = torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(n, k, device="cuda", dtype=dt)
            return (name, dname, e * (m * k + n * k + m * n), lambda x=x, w=w: F.linear(x, w), 2.0 * m * n * k)
        for m in [512, 4096]:
            yield case(f"gemm {m}x4096x4096", m, 4096, 4096)
        for name, k, n in MODEL_SHAPES:
            yield case(f"gemm {name} 512x{k}x{n}", 512, k, n)
        for name, k, n in MODEL_SHAPES:
            yield case(f"gemv {name} 1x{k}x{n}", 1, k, n)
        yield case("gemv gate_up 16x1536x17920", 16, 1536, 17920)
        for m in [1, 512]:
            h, i = 1536, 8960
            x = torch.randn(m, h, device="cuda", dtype=dt)
            g = torch.randn(i, h, device="cuda", dtype=dt)
            u = torch.randn(i, h, device="cuda", dtype=dt)
            yield (f"gated_mlp {m}x{h}x{i}", dname, e * (m * h + 2 * i * h + m * i),
                   lambda x=x, g=g, u=u: F.silu(F.linear(x, g)) * F.linear(x, u), 4.0 * m * i * h)


def _sdpa_flash_only():
    """Pins SDPA to its FlashAttention-2 backend (the attention peer of the benchmarks) once, globally, so the
    timed call carries no context-manager overhead."""
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def _gqa_call(q, k, v, causal, scale):
    """SDPA with native GQA (`enable_gqa=True`) when the flash backend takes it; otherwise K/V
    expanded to every query head once, outside the timed region. Returns (fn, note)."""
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
        torch.cuda.synchronize()
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                       enable_gqa=True),
                "sdpa flash, enable_gqa=True")
    except RuntimeError:
        rep = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return (lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=causal, scale=scale),
                "sdpa flash, K/V expanded to Hq heads (repeat_interleave outside the timing)")


def _graphed(fn):
    """`fn` captured once as a CUDA graph; returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def attention_cases():
    """Same names and byte/FLOP counts as `bench::attention`. Tensors in SDPA's own
    layout [1, H, L, D]. Decode (one query) runs with is_causal=False: SDPA's causal mask is
    top-left aligned, and the one query sees every key anyway."""
    _sdpa_flash_only()
    hq, hkv, d = 12, 2, 128
    scale = d ** -0.5
    for dname in ["bf16", "f16"]:
        dt = DTYPES[dname]
        e = torch.empty((), dtype=dt).element_size()
        for l in ([512, 2048, 8192] if dname == "bf16" else [2048]):
            q = torch.randn(1, hq, l, d, device="cuda", dtype=dt)
            k = torch.randn(1, hkv, l, d, device="cuda", dtype=dt)
            v = torch.randn(1, hkv, l, d, device="cuda", dtype=dt)
            fn, _note = _gqa_call(q, k, v, True, scale)
            yield (f"prefill causal L{l} h{hq}/{hkv} d{d}", dname,
                   e * (2 * l * hq * d + 2 * l * hkv * d), fn, 4 * d * hq * l * (l + 1) // 2)
        for l in ([1024, 4096, 32768] if dname == "bf16" else [4096]):
            q = torch.randn(1, hq, 1, d, device="cuda", dtype=dt)
            k = torch.randn(1, hkv, l, d, device="cuda", dtype=dt)
            v = torch.randn(1, hkv, l, d, device="cuda", dtype=dt)
            fn, _note = _gqa_call(q, k, v, False, scale)
            nbytes, flops = e * (2 * l * hkv * d + 2 * hq * d), 4 * l * d * hq
            yield (f"decode L{l} h{hq}/{hkv} d{d}", dname, nbytes, fn, flops)
            yield (f"decode graph L{l} h{hq}/{hkv} d{d}", dname, nbytes, _graphed(fn), flops)


def quant_cases():
    """Peers of bench::quant (bf16 activations): W8A8 as per-row int8 quantization of x,
    torch._int_mm and the float dequantization (the same work as ours; _int_mm needs M > 16, so
    the decode cases compare with our own bf16 GEMV instead), and torch._scaled_mm on e4m3
    operands quantized beforehand with per-row / per-column scales; W4A16 against the bf16
    torch.matmul of the same shape (the dense product the int4 layer replaces)."""
    dt = torch.bfloat16
    for m in [512, 4096]:
        k = n = 4096
        x = torch.randn(m, k, device="cuda", dtype=dt)
        wq = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
        wt = wq.t()  # [K, N] column-major, what cuBLASLt's int8 GEMM wants
        sw = torch.rand(n, device="cuda") / 127

        def w8a8(x=x, wt=wt, sw=sw):
            s = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / 127
            xq = (x.float() / s).round().clamp(-127, 127).to(torch.int8)
            return (torch._int_mm(xq, wt).float() * s * sw).to(dt)
        yield (f"w8a8 {m}x{k}x{n}", "bf16", 2 * (m * k + m * n) + n * k + 4 * n, w8a8, 2.0 * m * n * k)
    for m in [4096, 512]:
        k = n = 4096
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        sa = torch.rand(m, 1, device="cuda")
        sb = torch.rand(1, n, device="cuda")
        yield (f"fp8_gemm {m}x{k}x{n}", "bf16", m * k + n * k + 2 * m * n,
               lambda a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=dt),
               2.0 * m * n * k)
    for m in [512, 4096]:
        k = n = 4096
        x = torch.randn(m, k, device="cuda", dtype=dt)
        w = torch.randn(n, k, device="cuda", dtype=dt)
        yield (f"w4a16 {m}x{k}x{n}", "bf16", 2 * (m * k + m * n + n * k),
               lambda x=x, w=w: torch.matmul(x, w.t()), 2.0 * m * n * k)


def graph_of(fn, count):
    """`count` calls of `fn` captured as one CUDA graph; returns its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(count):
            fn()
    return g.replay


def addlab_cases():
    # Same names as the lab's lab::addlab (dev/lab; docs/investigations/add.md): add at 4096 x
    # 4096 eager (allocating and into a preallocated output), 20 adds replayed from one CUDA
    # graph, and operands carved from one buffer with `off` bytes between them.
    rows, n = 4096, 4096
    # cubellm's own random operands (bench::randn seeds 1 and 2), bit for bit, for the `ourdata`
    # cases: whether the data, rather than the kernel, separates the two sides.
    fast = cubellm_randn(1001, 7).cpu()
    err = (fast - cubellm_randn_slow(1001, 7)).abs().max().item()
    print(f"cubellm_randn check: max |fast - slow| = {err:.3g}", file=sys.stderr)
    ours = [cubellm_randn(rows * n, seed) for seed in (1, 2)]
    for dname in ["f16", "f32", "bf16"]:
        dt = DTYPES[dname]
        e = torch.empty((), dtype=dt).element_size()
        nbytes = e * 3 * rows * n
        a = torch.randn(rows, n, device="cuda", dtype=dt)
        b = torch.randn(rows, n, device="cuda", dtype=dt)
        o = torch.empty_like(a)
        yield ("sync idle", dname, 0, torch.cuda.synchronize)
        yield ("add then sync", dname, nbytes,
               lambda a=a, b=b, o=o: (torch.add(a, b, out=o), torch.cuda.synchronize()))
        yield ("add eager alloc", dname, nbytes, lambda a=a, b=b: a + b)
        yield ("add eager", dname, nbytes, lambda a=a, b=b, o=o: torch.add(a, b, out=o))
        yield ("add graph x20", dname, 20 * nbytes,
               graph_of(lambda a=a, b=b, o=o: torch.add(a, b, out=o), 20))
        sets = [(a.clone(), b.clone(), torch.empty_like(a)) for _ in range(4)]
        turn = [0]

        def rotate(sets=sets, turn=turn):
            x, y, z = sets[turn[0] % 4]
            turn[0] += 1
            torch.add(x, y, out=z)
        yield ("add eager rotate4", dname, nbytes, rotate)
        ca, cb = (x.to(dt).view(rows, n) for x in ours)
        yield ("add eager ourdata", dname, nbytes, lambda a=ca, b=cb, o=o: torch.add(a, b, out=o))
        yield ("add graph x20 ourdata", dname, 20 * nbytes,
               graph_of(lambda a=ca, b=cb, o=o: torch.add(a, b, out=o), 20))
        la, lb = (torch.randn(4096, 1536, device="cuda", dtype=dt) for _ in range(2))
        lo = torch.empty_like(la)
        yield ("add eager 4096x1536", dname, e * 3 * 4096 * 1536,
               lambda a=la, b=lb, o=lo: torch.add(a, b, out=o))
        # Two adds per call on different operand sets (cubellm's `add pair` cases).
        x, y, z = sets[0]
        yield ("add pair", dname, 2 * nbytes,
               lambda a=a, b=b, o=o, x=x, y=y, z=z: (torch.add(a, b, out=o), torch.add(x, y, out=z)))
        xa, xb = (torch.randn(4096, 1536, device="cuda", dtype=dt) for _ in range(2))
        xo = torch.empty_like(xa)
        yield ("add pair 4096x1536", dname, 2 * e * 3 * 4096 * 1536,
               lambda a=xa, b=xb, o=xo, x=la, y=lb, z=lo: (torch.add(a, b, out=o), torch.add(x, y, out=z)))
        # cubellm's default bench data (0.5 or 0.25 times 1 + (i % 7) / 100), to separate the
        # data's effect on the DRAM from the kernels'.
        i7 = (torch.arange(rows * n, device="cuda") % 7).float() * 0.01 + 1.0
        qa = (0.5 * i7).to(dt).view(rows, n)
        qb = (0.25 * i7).to(dt).view(rows, n)
        del i7
        yield ("add eager pattern", dname, nbytes, lambda a=qa, b=qb, o=o: torch.add(a, b, out=o))
        yield ("add graph x20 pattern", dname, 20 * nbytes,
               graph_of(lambda a=qa, b=qb, o=o: torch.add(a, b, out=o), 20))
        for off in [0, 1024, 65536, 1 << 20, (5 << 20) + 4096]:
            numel, gap = rows * n, off // e
            buf = torch.empty(3 * numel + 2 * gap, device="cuda", dtype=dt)
            pa = buf[:numel].view(rows, n)
            pb = buf[numel + gap:2 * numel + gap].view(rows, n)
            po = buf[2 * numel + 2 * gap:3 * numel + 2 * gap].view(rows, n)
            pa.copy_(a)
            pb.copy_(b)
            yield (f"add packed off{off}", dname, nbytes,
                   lambda a=pa, b=pb, o=po: torch.add(a, b, out=o))


FAMILIES = {"norm": norm_cases, "core": core_cases, "matmul": matmul_cases, "attention": attention_cases,
            "sparse": sparse_cases, "quant": quant_cases,
            "addlab": addlab_cases}


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
            s, steady = time_launches(fn)
            print(json.dumps({"impl": impl, "family": fam, "case": name, "dtype": dname,
                              "runtime": "cuda", "us": round(s * 1e6, 3),
                              "us_steady": round(steady * 1e6, 3), "bytes": nbytes,
                              "flops": flops, "gbps": round(nbytes / s / 1e9, 1),
                              "tflops": round(flops / s / 1e12, 2)}), flush=True)


if __name__ == "__main__":
    main()
