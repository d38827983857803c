#!/usr/bin/env python3
"""Per-kernel table of a graph-replayed decode step, from a CUPTI kernel trace
(dev/profile/kernel_trace.c) and, optionally, Nsight Compute's DRAM byte counts of one step.

    python3 dev/profile/decode_table.py trace.csv [--ncu ncu.csv] [--bandwidth 2.98e12]
            [--skip-info] [--markdown] [--json out.json]

The trace holds every kernel of the process; the decode step is the kernels launched from CUDA
graphs (graph_id != 0). Each replay launches the same nodes in the same order; the table gives,
per node (in launch order), the median over replays of the time it adds to the step (its end
minus the previous kernel's end: with programmatic dependent launch a kernel starts before its
predecessor ends and waits, so its own duration overlaps the one before), its duration, the gap
between the previous kernel's end and its start (negative: launched early), its grid, and, with
--ncu, the bytes it moved and the share of the copy bandwidth that makes over the time it adds.
Kernels are also summed by name, each kernel position of a decoder layer gets its median over
the layers (a layer taken to start at the kernel before each RoPE kernel), and the step's wall
time is the median over replays of first start to last end.

`--skip-info` prints, for the ncu pass, how many kernels ran before the first replay and how
many one replay has (ncu --launch-skip / --launch-count, which count graph nodes as launches
under --graph-profiling node).
"""
import argparse
import csv
import json
import re
import statistics
import sys


def short(name):
    """The kernel's function name without template arguments or the CubeCL hash suffix."""
    n = re.sub(r"<.*>", "", name)
    n = re.sub(r"\(.*\)", "", n)
    return re.sub(r"_[0-9a-f]{6,}$", "", n.split("::")[-1])


def load_trace(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append({
                "start": int(r["start_ns"]), "end": int(r["end_ns"]),
                "grid": (int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"])),
                "block": (int(r["block_x"]), int(r["block_y"]), int(r["block_z"])),
                "regs": int(r["regs"]), "graph": int(r["graph_id"]),
                "node": int(r["graph_node"]), "name": r["name"],
            })
    rows.sort(key=lambda r: r["start"])
    return rows


def replays(rows):
    """Splits the graph-launched kernels into replays: a new replay starts when a node id comes
    back. Returns (kernels before the first replay, [replay, ...]) for the most replayed graph."""
    graphs = {}
    for r in rows:
        if r["graph"]:
            graphs.setdefault(r["graph"], []).append(r)
    if not graphs:
        sys.exit("no kernel was launched from a CUDA graph in this trace")
    gid = max(graphs, key=lambda g: len(graphs[g]))
    runs, cur, seen = [], [], set()
    for r in graphs[gid]:
        if r["node"] in seen:
            runs.append(cur)
            cur, seen = [], set()
        cur.append(r)
        seen.add(r["node"])
    if cur:
        runs.append(cur)
    length = max(len(x) for x in runs)
    runs = [x for x in runs if len(x) == length]
    first = runs[0][0]["start"]
    before = sum(1 for r in rows if r["start"] < first)
    return before, runs


def load_ncu(path):
    """Per profiled kernel, in order: DRAM bytes read + written (ncu --csv --page raw or the
    default details page with the metrics dram__bytes_read.sum and dram__bytes_write.sum)."""
    text = open(path).read().splitlines()
    start = next(i for i, l in enumerate(text) if l.startswith('"ID"'))
    out = {}
    for r in csv.DictReader(text[start:]):
        kid = int(r["ID"])
        name, value, unit = r.get("Metric Name"), r.get("Metric Value"), r.get("Metric Unit", "")
        if name not in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
            continue
        scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
        out[kid] = out.get(kid, 0.0) + float(value.replace(",", "")) * scale
    return [out[k] for k in sorted(out)]


def per_layer(table):
    """Medians over the decoder layers of each kernel position in a layer: a layer starts at the
    kernel before each RoPE kernel, or (RoPE inside the attention) before each attention kernel:
    the qkv projection, and runs to the next one; layers whose kernel sequence differs from the
    first full one are left out. Returns [(kernel, µs added, busy µs)] and the number of layers."""
    mark = next((row["kernel"] for row in table
                 if re.search("rope|split_kv|attention", row["kernel"])), None)
    starts = [i - 1 for i, row in enumerate(table) if row["kernel"] == mark and i > 0]
    if len(starts) < 2:
        return [], 0
    period = starts[1] - starts[0]
    names = [row["kernel"] for row in table[starts[0]:starts[0] + period]]
    layers = [table[s:s + period] for s in starts if s + period <= len(table)
              and [row["kernel"] for row in table[s:s + period]] == names]
    return [(names[j], round(statistics.median(layer[j]["us"] for layer in layers), 2),
             round(statistics.median(layer[j]["busy_us"] for layer in layers), 2))
            for j in range(period)], len(layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--ncu", help="ncu --csv output of one replay's kernels")
    ap.add_argument("--bandwidth", type=float, default=2.98e12, help="copy bandwidth, B/s")
    ap.add_argument("--skip-info", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = load_trace(args.trace)
    before, runs = replays(rows)
    if args.skip_info:
        print(f"launch-skip {before} launch-count {len(runs[0])} replays {len(runs)}")
        return
    # Leave out the first replays (clocks, caches) when there are enough.
    timed = runs[2:] if len(runs) > 6 else runs
    n = len(timed[0])
    busy = [statistics.median((r[i]["end"] - r[i]["start"]) / 1e3 for r in timed) for i in range(n)]
    dur = [busy[0]] + [statistics.median((r[i]["end"] - r[i - 1]["end"]) / 1e3 for r in timed)
                       for i in range(1, n)]
    gap = [0.0] + [statistics.median((r[i]["start"] - r[i - 1]["end"]) / 1e3 for r in timed)
                   for i in range(1, n)]
    step = statistics.median((r[-1]["end"] - r[0]["start"]) / 1e3 for r in timed)
    nbytes = load_ncu(args.ncu) if args.ncu else None
    if nbytes is not None and len(nbytes) != n:
        print(f"warning: ncu profiled {len(nbytes)} kernels, a replay has {n}; bytes left out",
              file=sys.stderr)
        nbytes = None
    table = []
    for i, k in enumerate(timed[0]):
        row = {"i": i, "kernel": short(k["name"]), "grid": "x".join(map(str, k["grid"])),
               "block": "x".join(map(str, k["block"])), "us": round(dur[i], 2),
               "busy_us": round(busy[i], 2), "gap_us": round(gap[i], 2),
               "share": round(dur[i] / step, 4)}
        if nbytes:
            row["bytes"] = int(nbytes[i])
            row["bw_share"] = round(nbytes[i] / (dur[i] * 1e-6) / args.bandwidth, 3)
        table.append(row)
    by_name = {}
    for row in table:
        agg = by_name.setdefault(row["kernel"], {"count": 0, "us": 0.0, "bytes": 0})
        agg["count"] += 1
        agg["us"] += row["us"]
        agg["bytes"] += row.get("bytes", 0)
    summary = {"replays": len(timed), "kernels_per_step": n, "step_us": round(step, 1),
               "kernel_us": round(sum(busy), 1), "gap_us": round(sum(gap), 1),
               "bytes": int(sum(nbytes)) if nbytes else None}
    layer, n_layers = per_layer(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "kernels": table, "by_name": by_name,
                       "per_layer": [{"kernel": k, "us": us, "busy_us": b} for k, us, b in layer]},
                      f, indent=1)
    sep = " | " if args.markdown else "  "
    head = ["#", "kernel", "grid", "block", "µs added", "busy µs", "gap µs", "share"]
    if nbytes:
        head += ["MB", "% copy BW"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for row in table:
        cells = [row["i"], row["kernel"], row["grid"], row["block"], f"{row['us']:.2f}",
                 f"{row['busy_us']:.2f}", f"{row['gap_us']:.2f}", f"{100 * row['share']:.1f}%"]
        if nbytes:
            cells += [f"{row['bytes'] / 1e6:.2f}", f"{100 * row['bw_share']:.0f}%"]
        line = sep.join(str(c) for c in cells)
        print(f"| {line} |" if args.markdown else line)
    print()
    print("by kernel: " + "; ".join(
        f"{k} x{v['count']} {v['us']:.1f} µs ({100 * v['us'] / step:.0f}%)"
        + (f", {100 * v['bytes'] / (v['us'] * 1e-6) / args.bandwidth:.0f}% BW" if nbytes else "")
        for k, v in sorted(by_name.items(), key=lambda kv: -kv[1]["us"])))
    if layer:
        print(f"per layer (median of {n_layers}): " + "; ".join(
            f"{k} {us:.2f} µs" for k, us, _ in layer)
            + f"; sum {sum(us for _, us, _ in layer):.1f} µs")
    print(f"step {summary['step_us']} µs over {len(timed)} replays: {n} kernels, "
          f"{summary['kernel_us']} µs of kernel durations (overlapping), "
          f"{summary['gap_us']} µs of gaps"
          + (f", {summary['bytes'] / 1e6:.1f} MB moved "
             f"({100 * summary['bytes'] / (step * 1e-6) / args.bandwidth:.0f}% of copy bandwidth)"
             if nbytes else ""))


if __name__ == "__main__":
    main()
