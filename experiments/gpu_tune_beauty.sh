#!/usr/bin/env bash
# One call on two H200s (session 6): GPU 0 runs the 20-trial `recsys tune` of comirec_sa on Amazon
# Beauty (issue 12's acceptance: the tuned config beats the defaults on test Recall@50); GPU 1 runs
# SIDE: "study" = round 5 of the collapse study (issue 11: seeds), or "kernels" = the kernel GPU
# tests, experiments/host_overhead.py and the two kernel benches (issue 13). Each side is pinned to
# its own half of the CPU cores.
#
#   bash experiments/gpu_tune_beauty.sh OUT_DIR [TUNE_MINUTES] [SIDE] [STUDY_MINUTES]
#
# Needs .gpu_data/ (the datasets) and .whl/ (optuna and its dependencies as wheels; the device
# image has no optuna) carried to the device.
set -uo pipefail
out=${1:?output folder}; tune_minutes=${2:-7}; side=${3:-study}; study_minutes=${4:-6}
mkdir -p "$out"
first=$(bash experiments/cpu_half.sh 0) second=$(bash experiments/cpu_half.sh 1)  # by physical core
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
CUDA_VISIBLE_DEVICES=0 taskset -c "$first" python -m recsys tune --data .gpu_data/amazon-beauty/interactions.csv \
    --model comirec_sa --trials 20 --jobs 6 --max-minutes "$tune_minutes" --set output_dir=/tmp/tune \
    > "$out/tune.log" 2>&1 &
tune=$!
kernels() {
    RECSYS_ATTN_AUTOTUNE=0 timeout 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/kernels \
        > "$out/gpu_tests.log" 2>&1
    echo "kernel gpu tests exit $?"; tail -n 4 "$out/gpu_tests.log"
    timeout 40 python experiments/host_overhead.py --device cuda; echo "host_overhead exit $?"
    timeout 30 python experiments/host_overhead.py --device cuda --attention 64x50 --multi-interest 64x20x4
    timeout 170 python experiments/bench_attention.py; echo "attention bench exit $?"
    timeout 120 python experiments/bench_multi_interest.py; echo "multi-interest bench exit $?"
}
if [ "$side" = kernels ]; then
    export -f kernels; export out
    CUDA_VISIBLE_DEVICES=1 taskset -c "$second" bash -c kernels > "$out/kernels.log" 2>&1 &
else
    CUDA_VISIBLE_DEVICES=1 taskset -c "$second" bash experiments/gpu_collapse.sh "$out/study" "$study_minutes" 5 \
        > "$out/study.log" 2>&1 &
fi
other=$!
wait $tune; echo "tune exit $?"
wait $other; echo "$side exit $?"
grep -v "^  \[" "$out/tune.log" | tail -n 40
[ "$side" = kernels ] && cat "$out/kernels.log" || tail -n 12 "$out/study/study_taobao.md" "$out/study/study_amazon-beauty.md"
