#!/usr/bin/env bash
# One device call on two H200s for issue 13 (GPU tests, kernel benches, `recsys train` speed with
# no flags, DDP with graphs), the two GPUs kept busy side by side:
#   GPU 0: the GPU tests (one GPU), then taobao no flags / true / false, then the 1M-user data;
#   GPU 1: bench_attention.py, then bench_multi_interest.py (public functions, launched and graphed);
#   then both GPUs: torchrun with graphs at 2 x 1024 and 2 x 512, and the two-GPU test.
#
#   bash experiments/gpu_issue13.sh OUT_DIR
set -uo pipefail
out=${1:?output folder}; mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=/tmp/bench_train_defaults_work
(
    export CUDA_VISIBLE_DEVICES=0
    bash experiments/bench_train_defaults.sh data .gpu_data/taobao/sequences.txt "$out/data" "$work" > /dev/null 2>&1 &
    data=$!  # the 1M-user data, generated on the CPU meanwhile (a child of this subshell, so it can wait)
    RECSYS_ATTN_AUTOTUNE=0 timeout 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --continue-on-collection-errors tests/kernels tests/train \
        tests/evaluate tests/serve tests/models tests/nn -k "not two" > "$out/gpu_tests.log" 2>&1
    echo "gpu tests exit $?" >> "$out/gpu_tests.log"
    timeout 120 bash experiments/bench_train_defaults.sh taobao .gpu_data/taobao/sequences.txt "$out/taobao" "$work"
    wait $data
    timeout 150 bash experiments/bench_train_defaults.sh synthetic1M .gpu_data/taobao/sequences.txt "$out/synthetic1M" "$work"
) > "$out/gpu0.log" 2>&1 &
gpu0=$!
(
    export CUDA_VISIBLE_DEVICES=1
    timeout 200 python experiments/bench_attention.py; echo "attention bench exit $?"
    timeout 130 python experiments/bench_multi_interest.py; echo "multi-interest bench exit $?"
) > "$out/gpu1.log" 2>&1 &
wait $gpu0 $!
timeout 130 bash experiments/bench_train_defaults.sh ddp2 .gpu_data/taobao/sequences.txt "$out/ddp" "$work" > "$out/ddp.log" 2>&1
timeout 60 python -m pytest -q -m gpu -p no:cacheprovider tests/train/test_graphs.py -k "two" > "$out/gpu_tests_2gpu.log" 2>&1
tail -n 25 "$out/gpu_tests.log"; tail -n 5 "$out/gpu_tests_2gpu.log"
cat "$out/gpu1.log" "$out/gpu0.log" "$out/ddp.log"
