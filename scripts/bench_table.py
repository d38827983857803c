#!/usr/bin/env python3
"""Joins the JSON lines of `cubellm bench` (or `lab`) and `scripts/bench_torch.py` into a
Markdown table.

    python3 scripts/bench_table.py ours.jsonl torch.jsonl [--peak-gbps 2980] [--steady]

`--steady` compares the steady-state time per launch (`us_steady`: the difference between
samples of n and n/2 launches, so the fixed cost of a sample, its first launch's latency and
its final sync, cancels) instead of the whole sample divided by its launches (`us`).
"""
import argparse
import json


def load(path, impl=None):
    """Records keyed by (family, case, dtype); only those of `impl` when given (the sparse
    family has two PyTorch peers: "torch" on the dense weight and "torch_bsr")."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if impl is None or r.get("impl") == impl:
                out[(r["family"], r["case"], r["dtype"])] = r
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("peer")
    ap.add_argument("--peak-gbps", type=float, default=2980.0)
    ap.add_argument("--steady", action="store_true")
    args = ap.parse_args()
    key = "us_steady" if args.steady else "us"
    ours, peer, bsr = load(args.ours), load(args.peer, "torch"), load(args.peer, "torch_bsr")
    print("| family | case | dtype | ours µs | ours GB/s | % of copy bw | ours TFLOP/s | torch µs | speed-up vs torch |"
          + (" torch BSR µs | speed-up vs torch BSR |" if bsr else ""))
    print("|---|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if bsr else ""))
    for name, r in ours.items():
        us = r[key]
        gbps = r["bytes"] / us / 1e3 if us else 0.0
        tflops = r["flops"] / us / 1e6 if us else 0.0
        p = peer.get(name)
        pus = f"{p[key]:.2f}" if p else "-"
        ratio = f"{p[key] / us:.2f}x" if p else "-"
        tf = f"{tflops:.1f}" if r.get("flops") else "-"
        pct = f"{100 * gbps / args.peak_gbps:.0f}%" if r.get("bytes") else "-"
        row = f"| {name[0]} | {name[1]} | {name[2]} | {us:.2f} | {gbps:.0f} | {pct} | {tf} | {pus} | {ratio} |"
        if bsr:
            b = bsr.get(name)
            row += f" {b[key]:.2f} | {b[key] / us:.2f}x |" if b else " - | - |"
        print(row)


if __name__ == "__main__":
    main()
