#!/usr/bin/env bash
# Device calls for continuous batching, on the 1.5B shape (scripts/make_hf_fixtures.py --big):
#   tests  the kernel tests it touches (ragged attention and QKV append, the dense products
#          including the tensor-core GEMV, W4A16), the
#          model's device tests (batched against alone, bit for bit; the transformers fixtures)
#          and the server's HTTP tests, on CUDA
#   gemv   `cubellm bench --family matmul` (the decode products at 1 and 16 rows, tensor-core
#          and CUDA-core GEMV), into $OUT/r/matmul.jsonl
#   bench  bench-generate of one sequence and --batch 1,2,4,8,16 (the decode step's speed by
#          batch size), recorded in $OUT/r/batch.jsonl
#   profile  per-kernel CUPTI tables of the batched step at 1 and 16 sequences ($OUT/r/profile)
#   load   `cubellm serve` under scripts/load_test.py (STREAMS, SECONDS per level)
#   burn   the Burn modules' tests and the burn-qwen2 example on CUDA (its two tok/s)
# Binaries xz-compressed in .devs/ (cubellm, ops-test, quant-test, model-test, server-test,
# burn-test, burn-qwen2).
#   bash dev/batch_device_run.sh "tests bench load" [STREAMS] [SECONDS]
# OPS_FILTER (default "ragged qkv matmul") picks the ops tests.
set -u
WHAT=${1:-tests bench load}
STREAMS=${2:-1,4,16,64}
SECS=${3:-60}
R=$OUT/r; mkdir -p $R
trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
source "$(dirname "$0")/device_setup.sh"
unpack_devs
C=.devs/cubellm
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
cp .devs/commit.txt $R/commit.txt
ensure_big_model $C $R/setup.log 200
export CUBELLM_TEST_RUNTIMES=cuda
has() { [[ " $WHAT " == *" $1 "* ]]; }
if has tests; then
  timeout 240 .devs/ops-test --test-threads=8 ${OPS_FILTER:-ragged qkv matmul} > $R/ops-test.log 2>&1
  echo "rc=$?" >> $R/ops-test.log
  [ -x .devs/quant-test ] && { timeout 200 .devs/quant-test --test-threads=8 w4a16 > $R/quant-test.log 2>&1; echo "rc=$?" >> $R/quant-test.log; }
  (cd crates/model && timeout 200 ../../.devs/model-test --test-threads=4) > $R/model-test.log 2>&1
  echo "rc=$?" >> $R/model-test.log
  [ -x .devs/server-test ] && { (cd crates/server && timeout 200 ../../.devs/server-test --test-threads=4) > $R/server-test.log 2>&1; echo "rc=$?" >> $R/server-test.log; }
fi
if has gemv; then
  timeout 300 $C --runtime cuda bench --family matmul > $R/matmul.jsonl 2> $R/matmul.err
fi
if has bench; then
  timeout 120 $C --runtime cuda bench-generate --model /tmp/big --prompt-len 512 --new-tokens 128 \
    --runs 3 --record $R/batch.jsonl > $R/bench-generate.out 2> $R/bench-generate.err
  timeout 200 $C --runtime cuda bench-generate --model /tmp/big --prompt-len 512 --new-tokens 128 \
    --runs 3 --batch 1,2,4,8,16 --record $R/batch.jsonl >> $R/bench-generate.out 2>> $R/bench-generate.err
fi
if has profile; then
  bash dev/profile/batch_profile.sh $C /tmp/big $R/profile 1 16 > /dev/null 2>&1
fi
if has load; then
  PROMPT="Write a short story about a lighthouse keeper who finds a message in a bottle, and what she decides to do about it."
  timeout 100 $C --runtime cuda generate --model /tmp/big --raw --prompt "$PROMPT" --max-new-tokens 128 \
    --temperature 0 > /dev/null 2> $R/generate-128.err
  $C --runtime cuda serve --model /tmp/big --port 8080 --queue-size 128 > $R/serve.log 2>&1 &
  SERVER=$!
  for i in $(seq 180); do grep -q serving $R/serve.log && break; sleep 1; done
  timeout $(( 4 * SECS * 2 + 60 )) python3 scripts/load_test.py --url http://127.0.0.1:8080 \
    --streams $STREAMS --duration $SECS --max-tokens 128 --out $R/load.jsonl \
    --label "$(cat $R/device.txt), $(cat $R/commit.txt)" > $R/load.md 2> $R/load.err
  curl -s localhost:8080/metrics > $R/metrics.txt
  kill -TERM $SERVER; wait $SERVER; echo "serve exit $?" >> $R/serve.log
fi
if has burn; then
  [ -x .devs/burn-test ] && { (cd crates/burn && timeout 200 ../../.devs/burn-test --test-threads=4) > $R/burn-test.log 2>&1; echo "rc=$?" >> $R/burn-test.log; }
  for i in 1 2; do
    timeout 200 .devs/burn-qwen2 --runtime cuda --fixture crates/model/tests/fixtures/hf/qwen2-4layer > $R/burn-qwen2-$i.log 2>&1
    echo "rc=$?" >> $R/burn-qwen2-$i.log
  done
fi
