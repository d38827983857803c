#!/usr/bin/env python3
"""One line per decode-step table (decode_table.py --json): the step's µs and, per decoder layer
(anchored on the attention kernel), the median µs each kernel around it adds, with its grid:
the two kernels before the attention, the attention, and the kernels up to the next one.

    python3 dev/profile/layer_summary.py LABEL table.json [...]
"""
import json
import statistics
import sys


def summary(path):
    t = json.load(open(path))
    ks = t["kernels"]
    att = [i for i, k in enumerate(ks) if "split_kv" in k["kernel"] or "attention" in k["kernel"]]
    if len(att) < 3:
        return f"step {t['summary']['step_us']} µs (no layers found)"
    period = att[1] - att[0]
    cols = []
    for off in range(-1, period - 1):
        vals = [ks[a + off]["us"] for a in att[1:-1] if 0 <= a + off < len(ks)]
        k = ks[att[1] + off]
        cols.append(f"{k['kernel'][:14]}[{k['grid']}x{k['block'].split('x')[0]}] "
                    f"{statistics.median(vals):.2f}")
    return f"step {t['summary']['step_us']} µs | " + " | ".join(cols)


if __name__ == "__main__":
    label = sys.argv[1]
    for p in sys.argv[2:]:
        print(f"{label}: {summary(p)}")
