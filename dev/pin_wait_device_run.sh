#!/usr/bin/env bash
# The decode GEMVs' `griddepcontrol.wait` pinned below their first weight loads
# (`ops::pdl::wait_after`), on the GPU machine from the repository root, in one call of under
# 10 minutes. ptxas 12.9 scheduled the bare wait above those loads in the bf16 tensor-core GEMV
# (batched decode's; one sequence's bf16 products run on the SIMT bf16 GEMV) and in the 8-bit
# SIMT gate-up and qkv, so their weights only started to load once the kernel before had
# finished.
#   .devs/  cubellm.xz of the commit under test (the SIMT GEMV's wait pinned), recorded first
#           with scripts/bench_e2e.sh beside the peer
#   .devl/  the same commit with dev/attempts/pin-wait-lab-switches.patch (dev/pack_device.sh:
#           cubellm, quant-test, model-test): CUBELLM_LAB_PIN_WAIT (the 8-bit SIMT GEMV, default
#           1), CUBELLM_LAB_PIN_GEMV (the bf16 tensor-core GEMV, default 0),
#           CUBELLM_LAB_SIMT_UPFRONT (all of a unit's weight vectors first where it takes at
#           most four steps along K, default 0)
#   .devb/  cubellm.xz of the build before (the baseline)
# First the CUDA tests of the 8-bit SIMT GEMV with each loop and of the model (transformers'
# logits with the pinned bf16 GEMV, float-activation decode), then two rounds of bench-generate
# (512-token prompt, 128 new tokens, 2 runs) in opposite orders. Results under $OUT/r (r.tgz).
set -u
source dev/device_setup.sh; begin_results
for d in .devb .devl; do
  for f in $d/*.xz; do xz -dkf "$f"; done
  chmod +x $d/*
done
start_model .devs/cubellm 240
export CUBELLM_TEST_RUNTIMES=cuda
tests=()
for u in 0 1; do
  (CUBELLM_LAB_SIMT_UPFRONT=$u timeout 120 .devl/quant-test --test-threads=4 \
    float_activations_simt > $R/quant-test-up$u.log 2>&1; echo "rc=$?" >> $R/quant-test-up$u.log) &
  tests+=($!)
done
(cd crates/model && CUBELLM_LAB_PIN_GEMV=1 timeout 150 ../../.devl/model-test --test-threads=4 \
  float_activation logits_and_greedy greedy_decoding_one_step > $R/model-test.log 2>&1
  echo "rc=$?" >> $R/model-test.log) &
tests+=($!)
wait "${tests[@]}"
grep -h "test result\|rc=\|FAILED\|panicked" $R/*-test*.log | head -30
wait_model
MODES="none w8a8 fp8 w4a16 w4a16+head w8a8+head fp8+head" RUNS=2 timeout 200 \
  bash scripts/bench_e2e.sh .devs/cubellm /tmp/big $R/e2e.jsonl 512 2> $R/e2e.err
grep -h "decode [0-9.]* tok" $R/e2e.err | grep -o "decode [0-9.]* tok/s"
bg() { # label binary [flags...]
  local label=$1 bin=$2
  shift 2
  [ $SECONDS -gt 530 ] && return
  timeout 60 $bin --runtime cuda bench-generate --model /tmp/big --prompt-len 512 \
    --new-tokens 128 --runs 2 --max-len 704 "$@" > $R/bg_$label.out 2>&1
  echo "$label: $(grep -o 'decode [0-9.]* tok/s' $R/bg_$label.out | tail -1)"
}
variant() { # round name
  local r=$1 v=$2
  case $v in
  base) for q in none w8a8 fp8; do bg ${r}_base_$q .devb/cubellm --quant $q; done ;;
  pin) for q in w8a8 fp8; do
      CUBELLM_LAB_PIN_GEMV=0 bg ${r}_pin_$q .devl/cubellm --quant $q; done ;;
  gemv) for q in none w8a8; do
      CUBELLM_LAB_PIN_GEMV=1 bg ${r}_gemv_$q .devl/cubellm --quant $q; done ;;
  up) for q in w8a8 fp8; do
      CUBELLM_LAB_SIMT_UPFRONT=1 bg ${r}_up_$q .devl/cubellm --quant $q; done ;;
  esac
}
for v in base pin gemv up; do variant r1 $v; done
for v in up gemv pin base; do variant r2 $v; done
