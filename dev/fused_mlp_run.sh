#!/usr/bin/env bash
# The gate-up and down projections in one launch, priced by a synthetic chain
# (dev/add_controls/fused_mlp.cu), on the GPU machine from the repository root:
# dev/synthetic_chain_run.sh's timing run and CUPTI trace ($OUT/r/fmlp.txt, fmlp_kernels.txt,
# fmlp_trace.csv.gz).
exec bash dev/synthetic_chain_run.sh fused_mlp fmlp FMLP_ROUNDS
