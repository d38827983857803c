#!/usr/bin/env python3
"""The device's idle time between graph replays of the decode step, from a CUPTI kernel trace
(dev/profile/kernel_trace.c): per pair of consecutive replays of the most replayed graph, the
first kernel's start minus the previous replay's last end, and each replay's span; medians.
Also the registers per thread of each distinct (kernel, grid, block) of one replay.

    python3 dev/profile/replay_gaps.py trace.csv
"""
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
