#!/usr/bin/env bash
# Sampled decode against greedy decode on the GPU machine, from the repository root, about 4
# minutes: `bench-generate` times the greedy decode and the sampled one in the same run, on the
# 28-layer 1.5B shape (prompt 512, 128 new tokens, two runs), bf16 and W4A16, three settings.
# .devs/ as `dev/pack_device.sh` leaves it (only cubellm is used); results under $OUT/r.
set -u
source dev/device_setup.sh; begin_results
C=.devs/cubellm
ensure_big_model $C $R/setup.log 240; echo "model rc=$?" >> $R/setup.log
i=0
for q in none w4a16; do
  quant=(); [ $q != none ] && quant=(--quant $q)
  for s in "--temperature 0.7 --top-p 0.95" "--temperature 0.7 --top-k 50" \
           "--top-k 50 --top-p 0.95 --repetition-penalty 1.1"; do
    i=$((i + 1))
    timeout 90 $C --runtime cuda bench-generate --model /tmp/big --prompt-len 512 \
      --new-tokens 128 --runs 2 "${quant[@]}" $s > $R/run_$i.json 2> $R/run_$i.log
    echo "== $q $s (rc=$?)"; grep -h "decode" $R/run_$i.log | tail -3
  done
done
