#!/usr/bin/env python3
"""The device's idle time between graph replays of the decode step, from a CUPTI kernel trace
(dev/profile/kernel_trace.c): per pair of consecutive replays of the most replayed graph, the
first kernel's start minus the previous replay's last end, and each replay's span; medians.
Also the registers per thread of each distinct (kernel, grid, block) of one replay and, where
the trace has its copies file (KERNEL_TRACE_COPIES; default: copies_*.csv beside trace_*.csv),
the memory copies that run inside the gaps: per gap, their count and device time, and the
time from the last copy's end to the next replay's first kernel (the graph's launch).

    python3 dev/profile/replay_gaps.py trace.csv [copies.csv]
"""
import csv
import os
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode_table import load_trace, replays, short  # noqa: E402

rows = load_trace(sys.argv[1])
_, runs = replays(rows)
runs = runs[2:] if len(runs) > 6 else runs
gaps = [(b[0]["start"] - a[-1]["end"]) / 1e3 for a, b in zip(runs, runs[1:])]
spans = [(r[-1]["end"] - r[0]["start"]) / 1e3 for r in runs]
print(f"replays {len(runs)}: span median {statistics.median(spans):.1f} µs, gap between "
      f"replays median {statistics.median(gaps):.1f} µs (min {min(gaps):.1f}, max {max(gaps):.1f})")
seen = {}
for k in runs[0]:
    key = (short(k["name"]), k["grid"], k["block"])
    seen.setdefault(key, k["regs"])
for (name, grid, block), regs in seen.items():
    print(f"  {name} grid {grid} block {block}: {regs} registers")

copies_path = sys.argv[2] if len(sys.argv) > 2 else sys.argv[1].replace("trace_", "copies_")
if copies_path != sys.argv[1] and os.path.exists(copies_path):
    with open(copies_path) as f:
        copies = sorted((int(r["start_ns"]), int(r["end_ns"]), int(r["bytes"]), r["kind"])
                        for r in csv.DictReader(f))
    counts, busy, to_launch, kinds = [], [], [], {}
    for a, b in zip(runs, runs[1:]):
        lo, hi = a[-1]["end"], b[0]["start"]
        inside = [c for c in copies if c[0] >= lo and c[1] <= hi]
        counts.append(len(inside))
        busy.append(sum(c[1] - c[0] for c in inside) / 1e3)
        if inside:
            to_launch.append((hi - inside[-1][1]) / 1e3)
        for c in inside:
            kinds.setdefault((c[3], c[2]), []).append((c[1] - c[0]) / 1e3)
    print(f"copies in the gaps: median {statistics.median(counts)} per gap, "
          f"{statistics.median(busy):.1f} µs of copy time; last copy's end to the next replay: "
          f"median {statistics.median(to_launch) if to_launch else float('nan'):.1f} µs")
    names = {"1": "HtoD", "2": "DtoH", "8": "DtoD"}
    for (kind, size), times in sorted(kinds.items()):
        print(f"  {names.get(kind, kind)} {size} B: {len(times)} copies, median "
              f"{statistics.median(times):.2f} µs")
