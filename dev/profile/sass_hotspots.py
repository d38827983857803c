#!/usr/bin/env python3
# Warp-stall samples per SASS line from `ncu -i REPORT --page source --csv --print-source sass`:
# every line with at least THRESHOLD samples (and every barrier, fence, wait and exit), with the
# running share of all samples.  python3 dev/profile/sass_hotspots.py SASS.csv [THRESHOLD]
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
thr=int(sys.argv[2]) if len(sys.argv)>2 else 15
hdr=rows[1]; data=rows[2:]
i_src=hdr.index('Source'); i_s=hdr.index('Warp Stall Sampling (All Samples)'); i_ex=hdr.index('Instructions Executed')
stall_cols=[i for i,h in enumerate(hdr) if h.startswith('stall_') and 'Not Issued' not in h]
tot=sum(int(r[i_s] or 0) for r in data)
print('total samples',tot,'instrs',len(data))
cum=0
for n,r in enumerate(data):
    s=int(r[i_s] or 0); cum+=s
    top=sorted(((int(r[i] or 0),hdr[i][6:]) for i in stall_cols),reverse=True)[:2]
    src=r[i_src].strip()
    if s>=thr or any(k in src for k in ('BAR.SYNC','UCGABAR','ACQBULK','MEMBAR','ERRBAR','EXIT','TRYWAIT')):
        print(f"{n:5d} {s:5d} {cum*100//tot:3d}% ex={r[i_ex]:>5} {src[:58]:58s} {top}")
