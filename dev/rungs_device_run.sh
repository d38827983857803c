#!/usr/bin/env bash
# The A/B of the decode attention planned per rung of cache rows, on the GPU machine from the
# repository root: .devs/ as `dev/pack_device.sh` leaves it (a build with the rungs) plus
# .devs/cubellm-old.xz, the CLI of a build without them (`4de672f`; pack_device.sh empties .devs,
# so copy it in afterwards: a copy is kept in the git-ignored .devs-keep/ of the working tree
# where it was built, else build the CLI of `4de672f`). First the CUDA tests the
# change touches and those whose input-norm reference `1960692` corrected, then bf16
# `bench-generate` at a 512-token prompt on caches of 704 / 4 096 / 32 768 positions and at a
# 2 048-token prompt on 2 240 / 32 768, both binaries, a second round of the 4 096 and 32 768
# rows. Results under $OUT/r (r.tgz).
#   bash dev/rungs_device_run.sh
set -u
R=$OUT/r; mkdir -p $R
trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
source dev/device_setup.sh; unpack_devs
C=.devs/cubellm
cp .devs/commit.txt $R/; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/device.txt
(ensure_big_model $C $R/setup.log 240; echo "model rc=$?" >> $R/setup.log) &
MP=$!
export CUBELLM_TEST_RUNTIMES=cuda
timeout 120 .devs/quant-test --test-threads=8 linear8_fused rowquant tensor_core > $R/quant-test.log 2>&1; echo "rc=$?" >> $R/quant-test.log
timeout 90 .devs/ops-test --test-threads=8 normed sampling > $R/ops-test.log 2>&1; echo "rc=$?" >> $R/ops-test.log
(cd crates/model && timeout 120 ../../.devs/model-test --test-threads=4 across_the_first session:: transformers:: --nocapture) > $R/model-test.log 2>&1; echo "rc=$?" >> $R/model-test.log
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
grep -h "clustered rows" $R/model-test.log | head -10
wait $MP; tail -2 $R/setup.log
bg() { # label binary prompt max_len
  timeout 60 .devs/$2 --runtime cuda bench-generate --model /tmp/big --prompt-len $3 --new-tokens 128 --runs 2 --max-len $4 > $R/bg_$1.out 2>&1
  echo "$1: $(grep -h 'decode' $R/bg_$1.out | tail -1)"
}
for bin in cubellm-old cubellm; do
  for ml in 704 4096 32768; do bg r1_${bin}_p512_$ml $bin 512 $ml; done
  for ml in 2240 32768; do bg r1_${bin}_p2048_$ml $bin 2048 $ml; done
done
for bin in cubellm-old cubellm; do
  for ml in 4096 32768; do bg r2_${bin}_p512_$ml $bin 512 $ml; done
done
