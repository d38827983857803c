set -u
R=$OUT/r; mkdir -p $R
trap 'tar czf $OUT/r.tgz -C $OUT r' EXIT
for f in .devs/*.xz; do xz -dkf "$f"; done
chmod +x .devs/*
export CUBELLM_TEST_RUNTIMES=cuda
timeout 200 .devs/ops-test --test-threads=8 tensor_gemv gemv_rows matmul_normed > $R/ops-test.log 2>&1; echo "rc=$?" >> $R/ops-test.log
timeout 330 .devs/cubellm --runtime cuda bench --family gemv-sweep > $R/sweep.jsonl 2> $R/sweep.err
