#!/usr/bin/env bash
# One device call for the interest-collapse study (issue 11): the GPU tests of the kernels and the
# training step, then comirec_sa (and sasrec_mi) variants side by side on taobao and amazon-beauty,
# every run in its own process on the one GPU, each capped by train.max_minutes.
#
#   bash experiments/gpu_collapse.sh OUT_DIR [MINUTES]
#
# Needs the datasets under .gpu_data/ (git-excluded copies of ../shared/data, carried to the device).
set -uo pipefail
out=${1:?output folder}
minutes=${2:-7}
mkdir -p "$out"
export OMP_NUM_THREADS=1 RECSYS_ATTN_AUTOTUNE=0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1

python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/kernels/test_multi_interest.py tests/train \
    > "$out/gpu_tests.log" 2>&1 &
tests=$!

study() {  # study DATA SOURCE STEPS EVAL_EVERY
    python experiments/collapse_study.py --data "$1" --jobs 11 --output-dir /tmp/recsys_runs \
        --set "data.source=$2" --set "train.max_steps=$3" --set "train.eval_every=$4" \
        --set train.cuda_graph=true --set "train.max_minutes=$minutes" \
        --variant "K=1" model.num_interests=1 \
        --variant "K=4" \
        --variant "K=4 cap 1" model.score_cap=1 \
        --variant "K=4 cap 2" model.score_cap=2 \
        --variant "K=4 reg 0.3" train.attention_reg=0.3 \
        --variant "K=4 reg 1" train.attention_reg=1 \
        --variant "K=4 soft 5k" train.soft_readout_steps=5000 \
        --variant "K=4 hard 0.5" train.hard_negatives=0.5 \
        --variant "K=4 reg 1 soft 5k hard 0.5" train.attention_reg=1 train.soft_readout_steps=5000 train.hard_negatives=0.5 \
        --variant "sasrec_mi K=4" model.name=sasrec_mi \
        --variant "sasrec_mi K=4 reg 1" model.name=sasrec_mi train.attention_reg=1 \
        --results "$out/study_$1.md" > "$out/study_$1.log" 2>&1
}
study taobao .gpu_data/taobao/sequences.txt 200000 2500 &
taobao=$!
study amazon-beauty .gpu_data/amazon-beauty/interactions.csv 100000 1000 &
beauty=$!

wait $tests; echo "gpu tests: exit $?"; tail -n 5 "$out/gpu_tests.log"
wait $taobao; echo "taobao: exit $?"
wait $beauty; echo "beauty: exit $?"
tail -n 16 "$out/study_taobao.md" "$out/study_amazon-beauty.md" 2>/dev/null
