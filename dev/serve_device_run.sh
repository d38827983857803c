#!/usr/bin/env bash
# One device call: cold and warm time to first token with the persistent kernel cache, the
# server's HTTP tests on CUDA, and the load test (scripts/load_test.py) against `cubellm serve`
# on the 1.5B shape. Expects the binaries xz-compressed in .devs/ (cubellm.xz, server-test.xz).
#   bash dev/serve_device_run.sh [STREAMS] [SECONDS]
set -u
STREAMS=${1:-1,4,16,64}
SECS=${2:-60}
R=$OUT/r; mkdir -p $R
trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
source "$(dirname "$0")/device_setup.sh"
unpack_devs
C=.devs/cubellm
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
ensure_big_model $C $R/setup.log 200
cp .devs/commit.txt $R/commit.txt

# Time to first token: a fresh user (no kernel cache, no driver cache), then warm, then warm
# with only the driver's own PTX cache (our cache off).
ttft() { # $1 label, rest: extra flags
  local label=$1; shift
  local t0=$(date +%s.%N)
  timeout 200 $C --runtime cuda "$@" generate --model /tmp/big --prompt "Hello, who are you?" \
    --max-new-tokens 16 > $R/ttft-$label.out 2> $R/ttft-$label.err
  local t1=$(date +%s.%N)
  echo "$label wall $(python3 -c "print(round($t1-$t0,2))") s: $(grep -o 'time to first token [0-9.]* ms' $R/ttft-$label.err) | $(grep -o 'loaded.*' $R/ttft-$label.err)" >> $R/ttft.txt
}
export XDG_CACHE_HOME=/tmp/xdg CUDA_CACHE_PATH=/tmp/nvcache
rm -rf /tmp/xdg /tmp/nvcache
ttft cold
ttft warm1
ttft warm2
ttft nocache-warmdriver --no-kernel-cache
rm -rf /tmp/nvcache
ttft cold-driver-warm-ours
du -sh /tmp/xdg/cubellm/kernels >> $R/ttft.txt 2>&1

# The server's HTTP tests on CUDA.
(cd crates/server && CUBELLM_TEST_RUNTIMES=cuda timeout 300 ../../.devs/server-test --test-threads=4) > $R/server-test.log 2>&1
echo "server-test rc=$?" >> $R/server-test.log

# generate's own decode speed on the load test's request (same prompt and length).
PROMPT="Write a short story about a lighthouse keeper who finds a message in a bottle, and what she decides to do about it."
timeout 100 $C --runtime cuda generate --model /tmp/big --raw --prompt "$PROMPT" --max-new-tokens 128 \
  --temperature 0 > /dev/null 2> $R/generate-128.err

# Sampled decode (host sampler: the logits are read back every token) against greedy.
for mode in "--temperature 0" "--temperature 0.6 --top-p 0.95"; do
  timeout 100 $C --runtime cuda generate --model /tmp/big --raw --prompt "$PROMPT" --max-new-tokens 256 \
    $mode > /dev/null 2>> $R/sampled-vs-greedy.err
done

# Load test.
$C --runtime cuda serve --model /tmp/big --port 8080 --queue-size 128 > $R/serve.log 2>&1 &
SERVER=$!
for i in $(seq 120); do grep -q serving $R/serve.log && break; sleep 1; done
timeout $(( 4 * SECS * 2 + 60 )) python3 scripts/load_test.py --url http://127.0.0.1:8080 \
  --streams $STREAMS --duration $SECS --max-tokens 128 --out $R/load.jsonl \
  --label "$(cat $R/device.txt), $(cat $R/commit.txt)" > $R/load.md 2> $R/load.err
curl -s localhost:8080/metrics > $R/metrics.txt
kill -TERM $SERVER; wait $SERVER; echo "serve exit $?" >> $R/serve.log
