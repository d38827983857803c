#!/usr/bin/env bash
# Device calls for the decode step on the 1.5B shape (scripts/make_hf_fixtures.py --big), run from
# the repository root on the GPU machine with the xz-compressed binaries of
# `dev/pack_device.sh` in .devs/ (cubellm, ops-test, quant-test, model-test):
#   tests    the kernel tests the decode products touch (tensor-core GEMV with and without the
#            split-K scratch, rows independent of the batch, the 8-bit skinny kernel, the int4
#            GEMV, attention, the split and advancing argmax, the queued read-back) and the
#            model's device tests (transformers fixtures, batched == alone bit for bit), on CUDA
#   sweep    `cubellm bench --family gemv-sweep` (launch shapes of the tensor-core GEMV, weights
#            streamed from DRAM) into $OUT/r/sweep.jsonl
#   bench    scripts/bench_e2e.sh at 512 tokens: the PyTorch CUDA-graph peer, then every weight
#            format (MODES), recorded in $OUT/r/e2e.jsonl; then bf16 with --no-pdl
#   profile  dev/profile/decode_profile.sh (CUPTI trace of the graph replays) for PROFILE_MODES
#   long     scripts/bench_e2e.sh at LONG contexts (bf16 only), recorded in $OUT/r/e2e.jsonl
#   bash dev/decode_device_run.sh "tests sweep"
set -u
WHAT=${1:-tests bench}
R=$OUT/r; mkdir -p $R
trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
source "$(dirname "$0")/device_setup.sh"
unpack_devs
C=.devs/cubellm
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $R/device.txt
cp .devs/commit.txt $R/commit.txt 2>/dev/null
ensure_big_model $C $R/setup.log 240
export CUBELLM_TEST_RUNTIMES=cuda
has() { [[ " $WHAT " == *" $1 "* ]]; }
if has tests; then
  timeout 200 .devs/ops-test --test-threads=8 ${OPS_FILTER:-tensor_gemv rows_do_not normed decode_loop ragged_decode_matches dependent_chain qkv argmax rope_attention_decode queued_read} > $R/ops-test.log 2>&1
  echo "rc=$?" >> $R/ops-test.log
  timeout 200 .devs/quant-test --test-threads=8 ${QUANT_FILTER:-} > $R/quant-test.log 2>&1
  echo "rc=$?" >> $R/quant-test.log
  (cd crates/model && timeout 240 ../../.devs/model-test --test-threads=4) > $R/model-test.log 2>&1
  echo "rc=$?" >> $R/model-test.log
  grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -40
fi
if has sweep; then
  timeout 300 $C --runtime cuda bench --family gemv-sweep > $R/sweep.jsonl 2> $R/sweep.err
  python3 - $R/sweep.jsonl <<'EOF'
import json, sys
best = {}
for l in open(sys.argv[1]):
    try: r = json.loads(l)
    except Exception: continue
    name = r.get("case", ""); us = r.get("us_steady") or r.get("us")
    key = " ".join(name.split()[:3])
    if us and (key not in best or us < best[key][0]): best[key] = (us, name)
for k, (us, name) in sorted(best.items()): print(f"{us:9.2f} {name}")
EOF
fi
if has bench; then
  MODES=${MODES:-none w8a8 fp8 w4a16} RUNS=${RUNS:-3} timeout 500 bash scripts/bench_e2e.sh $C /tmp/big $R/e2e.jsonl 512 \
    > $R/bench.out 2> $R/bench.err
  timeout 60 $C --runtime cuda --no-pdl bench-generate --model /tmp/big --prompt-len 512 \
    --new-tokens 128 --runs 3 >> $R/bench.out 2>> $R/bench.err
  grep -h "decode\|prefill" $R/bench.out | tail -12
fi
if has profile; then
  build_trace_lib $R/trace-build.log
  TRACE_LIB=/tmp/libkernel_trace.so timeout 400 bash dev/profile/decode_profile.sh $C /tmp/big $R/profile \
    ${PROFILE_MODES:-none w8a8 w4a16} > $R/profile.out 2>&1
  tail -20 $R/profile.out
fi
if has long; then
  MODES=none RUNS=2 timeout 500 bash scripts/bench_e2e.sh $C /tmp/big $R/e2e.jsonl ${LONG:-4096 16384 32640} \
    > $R/long.out 2> $R/long.err
  tail -6 $R/long.out
fi
