#!/usr/bin/env bash
# Device calls for the defaults study (issue 12): `recsys train --data PATH --model M` with the
# defaults (GRID=0), or beside weight-decay and exact-softmax variants (GRID=1), every run its own
# process on the GPU, capped at MINUTES each.
#
#   bash experiments/gpu_defaults.sh OUT_DIR MINUTES JOBS GRID NAME=PATH [NAME=PATH ...]
#
# Datasets come from .gpu_data/ (git-excluded copies of ../shared/data carried to the device).
set -uo pipefail
out=${1:?output folder}; minutes=${2:?minutes per run}; jobs=${3:?parallel runs}; grid=${4:?0 or 1}; shift 4
mkdir -p "$out"
export OMP_NUM_THREADS=1 RECSYS_ATTN_AUTOTUNE=0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
data=(); for d in "$@"; do data+=(--data "$d"); done
variants=()
if [ "$grid" = 1 ]; then
    variants=(--variant "adam" train.optimizer=adam train.weight_decay=0
              --variant "wd 0.05" train.weight_decay=0.05 --variant "wd 0.2" train.weight_decay=0.2
              --variant "wd 0.5" train.weight_decay=0.5 --variant "full softmax" train.full_softmax=true)
fi
python experiments/defaults_study.py "${data[@]}" --jobs "$jobs" \
    --set train.cuda_graph=true --set train.max_minutes="$minutes" "${variants[@]}" \
    --output-dir /tmp/defaults_runs_$grid --logs /tmp/defaults_logs_$grid --results "$out/defaults_$grid.md"
tar czf "$out/logs_$grid.tgz" -C /tmp defaults_logs_$grid
