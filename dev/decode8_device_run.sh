#!/usr/bin/env bash
# The 8-bit formats decoding on the float activation (`--quant-decode float`, the kernel of
# crates/quant/src/gemm8/float_x.rs) and the decode attention planned per rung of cache rows, on
# the GPU machine from the repository root, in three calls of under 10 minutes (back to back, so
# that the machine and its /tmp/big checkpoint stay warm):
#   PART=tests bash dev/decode8_device_run.sh  the CUDA tests of both changes, of the int4 GEMV
#                                              (its end shared with the float kernel) and of the
#                                              corrected input-norm references
#   PART=ab    bash dev/decode8_device_run.sh  the quant kernel table at one row (codes beside
#                                              float), then bench-generate W8A8 and FP8 with
#                                              --quant-decode codes and float, two rounds, and
#                                              W8A8 float with the LM head in int8, at a
#                                              512-token prompt
#   PART=rungs bash dev/decode8_device_run.sh  the rungs A/B (bf16, the CLI of `4de672f` in
#                                              .devs/cubellm-old.xz against this build, prompts
#                                              of 512 and 2 048 tokens on several cache sizes)
# .devs/ as `dev/pack_device.sh` leaves it; for the rungs also .devs/cubellm-old.xz
# (pack_device.sh empties .devs, so copy it in afterwards: a copy is kept in the git-ignored
# .devs-keep/ of the working tree where it was built, else build the CLI of `4de672f`). Results
# under $OUT/r (r.tgz). The recorded end-to-end run follows with scripts/bench_e2e.sh, MODES
# chosen from these A/Bs (e.g. `w8a8+float`).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
start_model $C 240
export CUBELLM_TEST_RUNTIMES=cuda
bg() { # label binary prompt max_len [flags...]
  local label=$1 bin=$2 prompt=$3 ml=$4
  shift 4
  timeout 60 .devs/$bin --runtime cuda bench-generate --model /tmp/big --prompt-len $prompt \
    --new-tokens 128 --runs 2 --max-len $ml "$@" > $R/bg_$label.out 2>&1
  echo "$label: $(grep -h 'decode' $R/bg_$label.out | tail -1)"
}
case ${PART:-tests} in
tests)
  timeout 240 .devs/quant-test --test-threads=8 linear8_float_x linear8_fused w4a16:: \
    > $R/quant-test.log 2>&1; echo "rc=$?" >> $R/quant-test.log
  timeout 60 .devs/ops-test --test-threads=8 normed > $R/ops-test.log 2>&1; echo "rc=$?" >> $R/ops-test.log
  (cd crates/model && timeout 200 ../../.devs/model-test --test-threads=4 float_activation \
    across_the_first compressed --nocapture) > $R/model-test.log 2>&1; echo "rc=$?" >> $R/model-test.log
  grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
  grep -h "decode top-1" $R/model-test.log | head -10
  wait_model
  ;;
ab)
  timeout 150 $C --runtime cuda bench --family quant --filter " 1x" > $R/bench_quant.jsonl 2> $R/bench_quant.err
  bench_table $R/bench_quant.jsonl
  wait_model
  for round in 1 2; do
    for q in w8a8 fp8; do
      bg r${round}_${q}_codes cubellm 512 704 --quant $q --quant-decode codes
      bg r${round}_${q}_float cubellm 512 704 --quant $q --quant-decode float
    done
  done
  bg r1_w8a8_head_float cubellm 512 704 --quant w8a8 --quant-lm-head --quant-decode float
  ;;
rungs)
  wait_model
  for bin in cubellm-old cubellm; do
    for ml in 704 4096 32768; do bg r1_${bin}_p512_$ml $bin 512 $ml; done
    for ml in 2240 32768; do bg r1_${bin}_p2048_$ml $bin 2048 $ml; done
  done
  for bin in cubellm-old cubellm; do
    for ml in 4096 32768; do bg r2_${bin}_p512_$ml $bin 512 $ml; done
  done
  ;;
esac
