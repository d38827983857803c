#!/usr/bin/env bash
# The attention and o in one launch, priced by a synthetic chain (dev/add_controls/fused_attention_o.cu),
# on the GPU machine from the repository root: dev/synthetic_chain_run.sh's timing run and CUPTI
# trace ($OUT/r/fao.txt, fao_kernels.txt, fao_trace.csv.gz).
exec bash dev/synthetic_chain_run.sh fused_attention_o fao FAO_ROUNDS
