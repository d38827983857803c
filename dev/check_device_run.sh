#!/usr/bin/env bash
# One device call: the server's HTTP tests on CUDA, the model's device tests on CUDA with the
# current build and with a build without the two vendored CubeCL patches, sampled against greedy
# decode, and the model load against a plain read of its file. Binaries xz-compressed in .devs/.
set -u
R=$OUT/r; mkdir -p $R
trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
source "$(dirname "$0")/device_setup.sh"
unpack_devs
C=.devs/cubellm
ensure_big_model $C $R/setup.log 200
(cd crates/server && CUBELLM_TEST_RUNTIMES=cuda timeout 200 ../../.devs/server-test --test-threads=4) > $R/server-test.log 2>&1
echo "rc=$?" >> $R/server-test.log
for t in model-test model-test-nopatch; do
  [ -x .devs/$t ] || continue
  (cd crates/model && CUBELLM_TEST_RUNTIMES=cuda timeout 200 ../../.devs/$t --test-threads=4) > $R/$t.log 2>&1
  echo "rc=$?" >> $R/$t.log
done
PROMPT="Write a short story about a lighthouse keeper who finds a message in a bottle, and what she decides to do about it."
for mode in "--temperature 0" "--temperature 0.6 --top-p 0.95" "--temperature 0.6 --top-k 50"; do
  echo "== $mode" >> $R/sampling.err
  timeout 120 $C --runtime cuda generate --model /tmp/big --raw --prompt "$PROMPT" --max-new-tokens 256 \
    $mode > /dev/null 2>> $R/sampling.err
done
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
{ /usr/bin/time -f "cat: %e s" cat /tmp/big/*.safetensors > /dev/null; } 2>> $R/load.txt
{ /usr/bin/time -f "cat again: %e s" cat /tmp/big/*.safetensors > /dev/null; } 2>> $R/load.txt
du -sh /tmp/big >> $R/load.txt
timeout 100 $C --runtime cuda generate --model /tmp/big --prompt hi --max-new-tokens 1 2>&1 | grep loaded >> $R/load.txt
