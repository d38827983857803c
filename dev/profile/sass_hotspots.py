#!/usr/bin/env python3
"""Warp-stall samples per SASS line of one kernel, from Nsight Compute's source page.

    ncu ... --set full --warp-sampling-interval 0 -o REPORT CMD
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SASS.csv
    python3 dev/profile/sass_hotspots.py SASS.csv [THRESHOLD]

Prints every SASS line with at least THRESHOLD samples (15 by default) and every barrier, fence,
wait and exit, each with the running share of all samples up to it, how often it executed and
its two largest stall reasons. For a latency-bound kernel the running share between two
landmarks (the `ACQBULK` of `griddepcontrol.wait`, a `BAR.SYNC`, the cluster barrier's
`UCGABAR_*`) is that phase's share of the kernel's time.
"""
import csv
import sys

LANDMARKS = ("BAR.SYNC", "UCGABAR", "ACQBULK", "MEMBAR", "ERRBAR", "EXIT", "TRYWAIT")


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    threshold = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    header, data = rows[1], rows[2:]
    source = header.index("Source")
    samples = header.index("Warp Stall Sampling (All Samples)")
    executed = header.index("Instructions Executed")
    stalls = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[samples] or 0) for r in data)
    print(f"total samples {total}, SASS lines {len(data)}")
    running = 0
    for n, r in enumerate(data):
        s = int(r[samples] or 0)
        running += s
        text = r[source].strip()
        if s >= threshold or any(k in text for k in LANDMARKS):
            top = sorted(((int(r[i] or 0), header[i][6:]) for i in stalls), reverse=True)[:2]
            print(f"{n:5d} {s:5d} {running * 100 // max(total, 1):3d}% ex={r[executed]:>5} "
                  f"{text[:58]:58s} {top}")


if __name__ == "__main__":
    main()
