#!/usr/bin/env bash
# The 8-bit formats decoding on the float activation on the SIMT cores (`--quant-decode
# float-simt`, crates/quant/src/gemm8/float_x_simt.rs) against the tensor-core float path and the
# codes path, on the GPU machine from the repository root, in calls of under 10 minutes (back to
# back, so that the machine and its /tmp/big checkpoint stay warm):
#   PART=tests bash dev/float_simt_device_run.sh  the SIMT kernel's CUDA tests (the f64
#                                                 reference on awkward and model shapes, bf16,
#                                                 f16, f32; codes kept when rows-invariant), the
#                                                 model's float-activation decode against
#                                                 transformers' logits, then the quant kernel
#                                                 table at one row (codes, float, float-simt)
#   PART=ab    bash dev/float_simt_device_run.sh  bench-generate W8A8 and FP8 with --quant-decode
#                                                 codes, float and float-simt at a 512-token
#                                                 prompt (PART=ab2: a second round in the reverse
#                                                 order, in the next call)
#   PART=e2e   bash dev/float_simt_device_run.sh  the recorded scripts/bench_e2e.sh beside the
#                                                 peer (MODES, default bf16 and both 8-bit
#                                                 formats on float and float-simt)
#   PART=prof  bash dev/float_simt_device_run.sh  CUPTI per-layer tables of a 6-layer model of
#                                                 the same shape: W8A8 and FP8 on both float
#                                                 kernels, and bf16
# .devs/ as `dev/pack_device.sh` leaves it (cubellm, quant-test, model-test). Results under $OUT/r
# (r.tgz). The recorded end-to-end run follows with scripts/bench_e2e.sh, MODES chosen from
# these A/Bs (e.g. `none w4a16 w8a8 fp8`: the 8-bit formats' default is now float-simt).
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
if [ "${PART:-tests}" = prof ]; then start_model $C 150 6; else start_model $C 240; fi
export CUBELLM_TEST_RUNTIMES=cuda
bg() { # label [flags...]
  local label=$1
  shift
  timeout 60 $C --runtime cuda bench-generate --model /tmp/big --prompt-len 512 \
    --new-tokens 128 --runs 2 --max-len 704 "$@" > $R/bg_$label.out 2>&1
  echo "$label: $(grep -h 'decode' $R/bg_$label.out | tail -1)"
}
case ${PART:-tests} in
tests)
  timeout 240 .devs/quant-test --test-threads=8 float_activations_simt \
    float_activations_keep_codes > $R/quant-test.log 2>&1
  echo "rc=$?" >> $R/quant-test.log
  (cd crates/model && timeout 200 ../../.devs/model-test --test-threads=4 float_activation \
    --nocapture) > $R/model-test.log 2>&1; echo "rc=$?" >> $R/model-test.log
  grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test.log | head -30
  grep -h "decode top-1" $R/model-test.log | head -20
  timeout 150 $C --runtime cuda bench --family quant --filter " 1x" > $R/bench_quant.jsonl \
    2> $R/bench_quant.err
  bench_table $R/bench_quant.jsonl
  wait_model
  ;;
ab)
  wait_model
  for q in w8a8 fp8; do
    for d in codes float float-simt; do bg r1_${q}_$d --quant $q --quant-decode $d; done
  done
  ;;
ab2)
  wait_model
  for q in w8a8 fp8; do
    for d in float-simt float codes; do bg r2_${q}_$d --quant $q --quant-decode $d; done
  done
  ;;
e2e)
  wait_model
  MODES=${MODES:-none w8a8 w8a8+float fp8 fp8+float} RUNS=2 timeout 560 \
    bash scripts/bench_e2e.sh $C /tmp/big $R/e2e.jsonl 512 > $R/e2e.out 2> $R/e2e.err
  grep -h "decode\|peer" $R/e2e.out $R/e2e.err | tail -12
  ;;
prof)
  build_trace_lib $R/trace-build.log
  wait_model
  for mode in w8a8+float w8a8+float-simt fp8+float fp8+float-simt none; do
    echo "== $mode"; profile_layers $C $R/prof "$mode"
  done
  pack_traces $R/prof
  ;;
esac
