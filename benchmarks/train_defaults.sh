#!/usr/bin/env bash
# Is `recsys train` with no flags as fast as the best explicit launch setting?
#
#   bash benchmarks/train_defaults.sh [single|taobao|synthetic1M|data|pair|ddp|ddp2] [TAOBAO] [OUT_DIR] [WORK_DIR]
#
# taobao, synthetic1M: one half of single (to run the halves on two GPUs at once); data: only
# generate the 1M-user cache; ddp2: ddp without its one-GPU run (compare with synthetic1M's);
# pair (two GPUs): the 1M-user data's no-flags and cuda_graph=true runs at once, one per GPU.
#
# single (one GPU, ~4 minutes on an H200): `recsys train` with no train.cuda_graph flag (the
#   default, "auto"), with train.cuda_graph=true and with train.cuda_graph=false, one process at a
#   time, on taobao (experiments/configs/data/taobao.toml, batch 128, L = 50) and on the 1M-user
#   synthetic configuration (1M users x 1M generated items, ~975k after the 5-click filter, 40M
#   clicks, batch 1024, L = 20); prints samples/s and each setting's ratio to the best one.
# ddp (two GPUs, ~4 minutes): on the 1M-user synthetic data, no flags on one GPU (batch 1024)
#   against torchrun --nproc_per_node=2 with no flags at batch 1024 per GPU (the speed-up) and
#   at 512 per GPU (the same global batch and steps as one GPU: validation recall must match).
#
# TAOBAO defaults to ../shared/data/taobao/sequences.txt (on the device: .gpu_data/taobao/sequences.txt).
# OUT_DIR (default /tmp/bench_train_defaults) gets the logs and the table rows; WORK_DIR (default
# /tmp/bench_train_defaults_work) the 1M-user data cache (~1 GB, reused by later calls) and the run
# directories, each deleted once read.
# samples/s is the last logging window's (after compilation, autotuning and the capture), as
# `recsys train` prints it; each run is capped by train.max_steps and train.max_minutes.
set -uo pipefail
mode=${1:-single}
taobao=${2:-../shared/data/taobao/sequences.txt}
out=${3:-/tmp/bench_train_defaults}
work=${4:-/tmp/bench_train_defaults_work}
mkdir -p "$out" "$work"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

taobao_cfg=(--config experiments/configs/data/taobao.toml --set "data.source=$taobao"
            --set train.max_steps=4000 --set train.eval_every=4000 --set train.log_every=1000)
synthetic_cfg=(--set synthetic.num_users=1000000 --set synthetic.num_items=1000000 --set synthetic.mean_length=40
               --set "data.cache_dir=$work/cache" --set train.batch_size=1024 --set train.max_steps=3000
               --set train.eval_every=3000 --set train.log_every=500 --set eval.batch_size=4096
               --set data.valid_frac=0.01 --set data.test_frac=0.01)  # 10k valid and test users: quick validations
common=(--quiet --set "output_dir=$work/runs" --set train.max_minutes=1.5 --set train.patience=0)

run() {  # run LABEL LAUNCHER... -- recsys train args: log to $out/LABEL.log, print one table row
    label=$1; shift
    launcher=()
    while [ "$1" != "--" ]; do launcher+=("$1"); shift; done
    shift
    "${launcher[@]}" -m recsys train "${common[@]}" --set "name=$label" "$@" > "$out/$label.log" 2>&1
    status=$?
    sps=$(grep -o '[0-9,]* samples/s)' "$out/$label.log" | tail -n 1 | tr -d ',)' | cut -d' ' -f1)
    recall=$(grep -o 'recall@50 [0-9.]*' "$out/$label.log" | tail -n 1 | cut -d' ' -f2)
    launch=$(grep -o 'training step: [A-Za-z ]*' "$out/$label.log" | head -n 1 | cut -d' ' -f3-)
    echo "$label ${sps:-0} ${recall:--} ${status} ${launch:-?}" >> "$out/rows.txt"
    rm -rf "${work:?}/runs/$label"
}

table() {  # the rows of rows.txt whose label starts with $1, with ratios to the fastest of them
    grep "^$1" "$out/rows.txt" | awk -v name="$1" '
        { label[NR] = $1; sps[NR] = $2; rec[NR] = $3; rc[NR] = $4
          how[NR] = $5; for (f = 6; f <= NF; f++) how[NR] = how[NR] " " $f
          if ($2 > best) best = $2 }
        END { print "\n### " name "\n\n| setting | samples/s | ratio to best | valid recall@50 | step launched as | exit |"
              print "|---|---:|---:|---:|---|---:|"
              for (i = 1; i <= NR; i++)
                  printf "| %s | %d | %.2f | %s | %s | %d |\n", label[i], sps[i], best ? sps[i] / best : 0, rec[i], how[i], rc[i] }'
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
: > "$out/rows.txt"
# the 1M-user data is generated once into data.cache_dir (every later run, and every rank, reads it)
if [ "$mode" != taobao ]; then
    python -m recsys data --quiet "${synthetic_cfg[@]}" > "$out/data.log" 2>&1 || { cat "$out/data.log"; exit 1; }
    tail -n 3 "$out/data.log"
fi

if [ "$mode" = data ]; then
    :
elif [ "$mode" = single ] || [ "$mode" = taobao ] || [ "$mode" = synthetic1M ]; then
    [ "$mode" = single ] && sets=(taobao synthetic1M) || sets=("$mode")
    for data in "${sets[@]}"; do
        [ $data = taobao ] && args=("${taobao_cfg[@]}") || args=("${synthetic_cfg[@]}")
        run "${data}_no-flags" python -- "${args[@]}"
        run "${data}_cuda_graph=true" python -- "${args[@]}" --set train.cuda_graph=true
        run "${data}_cuda_graph=false" python -- "${args[@]}" --set train.cuda_graph=false
        table "$data"
    done
elif [ "$mode" = pair ]; then  # two GPUs: no flags on GPU 0 beside train.cuda_graph=true on GPU 1, each on half the cores
    first=$(bash benchmarks/cpu_half.sh 0) second=$(bash benchmarks/cpu_half.sh 1)  # by physical core
    CUDA_VISIBLE_DEVICES=0 taskset -c "$first" bash -c "$(declare -f run); $(declare -p out work common); \
        run synthetic1M_no-flags python -- $(printf '%q ' "${synthetic_cfg[@]}")" &
    CUDA_VISIBLE_DEVICES=1 taskset -c "$second" bash -c "$(declare -f run); $(declare -p out work common); \
        run synthetic1M_cuda_graph=true python -- $(printf '%q ' "${synthetic_cfg[@]}") --set train.cuda_graph=true" &
    wait
    table synthetic1M
    echo "(each setting on its own H200 of one host, at the same time, on its own half of the CPU cores)"
elif [ "$mode" = ddp ] || [ "$mode" = ddp2 ]; then
    two=(torchrun --standalone --nproc_per_node=2)
    [ "$mode" = ddp ] && run "ddp_1gpu_batch1024" python -- "${synthetic_cfg[@]}"
    run "ddp_2gpu_batch1024x2" "${two[@]}" -- "${synthetic_cfg[@]}"
    run "ddp_2gpu_batch512x2" "${two[@]}" -- "${synthetic_cfg[@]}" --set train.batch_size=512
    table ddp
    echo "(2 GPUs x 1024 against 1 GPU: the speed-up; 2 x 512 = the same global batch and steps as 1 GPU:"
    echo " its validation recall should equal one GPU's within run-to-run noise)"
else
    echo "mode: single, taobao, synthetic1M, data, ddp or ddp2, got $mode" >&2
    exit 2
fi
