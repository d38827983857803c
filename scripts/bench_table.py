#!/usr/bin/env python3
"""Joins the JSON lines of `cli bench` and `scripts/bench_torch.py` into a Markdown table.

    python3 scripts/bench_table.py ours.jsonl torch.jsonl [--peak-gbps 2980]
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
    args = ap.parse_args()
    ours, peer, bsr = load(args.ours), load(args.peer, "torch"), load(args.peer, "torch_bsr")
    print("| family | case | dtype | ours µs | ours GB/s | % of copy bw | ours TFLOP/s | torch µs | speed-up vs torch |"
          + (" torch BSR µs | speed-up vs torch BSR |" if bsr else ""))
    print("|---|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if bsr else ""))
    for key, r in ours.items():
        p = peer.get(key)
        pus = f"{p['us']:.2f}" if p else "-"
        ratio = f"{p['us'] / r['us']:.2f}x" if p else "-"
        tf = f"{r['tflops']:.1f}" if r.get("flops") else "-"
        pct = f"{100 * r['gbps'] / args.peak_gbps:.0f}%" if r.get("bytes") else "-"
        row = f"| {key[0]} | {key[1]} | {key[2]} | {r['us']:.2f} | {r['gbps']:.0f} | {pct} | {tf} | {pus} | {ratio} |"
        if bsr:
            b = bsr.get(key)
            row += f" {b['us']:.2f} | {b['us'] / r['us']:.2f}x |" if b else " - | - |"
        print(row)


if __name__ == "__main__":
    main()
