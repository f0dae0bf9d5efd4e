#!/usr/bin/env bash
# BSARec's logged Amazon Beauty run reproduced inside recsys, under its own rules (leave-one-out, every
# user scored: data.loo_rules = "every_user"), beside recsys's sasrec at its defaults under the same rules (seeds 42, 1, 2)
# (docs/results.md, "The BSARec lineage's rules"):
#
#   bash experiments/reproduce_bsarec.sh [DATA] [OUT_DIR] [MINUTES] [all|recipe|wearec|models]
#
# DATA: Amazon Beauty's interactions.csv (default ../shared/data/amazon-beauty/interactions.csv);
# OUT_DIR: tables, logs and runs (default /tmp/reproduce_bsarec); MINUTES: each run's training cap
# (default 8). The recipe (experiments/configs/recipes/bsarec.toml) runs at seeds 42, 1 and 2, and
# at seed 42 three ablations: attention alone (the lineage's SASRec), no attention dropout (attention on
# the kernels), and fp32 (no bf16 autocast). All runs share the machine, one process each; "recipe" runs
# the recipe's three seeds alone (each then gets a third of the GPU instead of a ninth); "wearec" runs
# WEARec's recipe (experiments/configs/recipes/wearec.toml: its wavelet block in the same pipeline) at the
# same three seeds alone; "models" runs `--model wearec` and `--model bsarec` at their defaults (the
# recipes as automatic values, with recsys's weight average, validation cadence and plateau stop) at
# the same three seeds, six processes.
set -uo pipefail
data=${1:-../shared/data/amazon-beauty/interactions.csv}
out=${2:-/tmp/reproduce_bsarec}
minutes=${3:-8}
mode=${4:-all}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
ablations=()
[ "$mode" = all ] && ablations=(--variant attention_only_s42 model.mixer=attention
    --variant no_attention_dropout_s42 model.attention_dropout=0 --variant fp32_s42 train.amp=false)
common=(--data "$data" --models "" --rules every_user --set "train.max_minutes=$minutes")
seeds=(--variant s42 train.seed=42 --variant s1 train.seed=1 --variant s2 train.seed=2)
if [ "$mode" = models ]; then
    runs=()
    for m in wearec bsarec; do
        for s in 42 1 2; do runs+=(--variant "${m}_s$s" "model.name=$m" "train.seed=$s"); done
    done
    python3 experiments/loo_beauty.py "${common[@]}" --jobs 6 --output-dir "$out/models" \
        --results "$out/models.md" "${runs[@]}" > "$out/models.log" 2>&1
    cat "$out/models.md"
    exit 0
fi
if [ "$mode" = wearec ]; then
    python3 experiments/loo_beauty.py "${common[@]}" --config experiments/configs/recipes/wearec.toml --jobs 3 \
        --output-dir "$out/wearec" --results "$out/wearec.md" "${seeds[@]}" > "$out/wearec.log" 2>&1
    cat "$out/wearec.md"
    exit 0
fi
python3 experiments/loo_beauty.py "${common[@]}" --config experiments/configs/recipes/bsarec.toml --jobs 6 \
    --output-dir "$out/recipe" --results "$out/recipe.md" \
    --variant bsarec_s42 train.seed=42 --variant bsarec_s1 train.seed=1 --variant bsarec_s2 train.seed=2 \
    "${ablations[@]}" > "$out/recipe.log" 2>&1 &
if [ "$mode" = recipe ]; then
    wait
    cat "$out/recipe.md"
    exit 0
fi
python3 experiments/loo_beauty.py "${common[@]}" --jobs 3 --output-dir "$out/defaults" --results "$out/defaults.md" \
    --variant sasrec_defaults_s42 model.name=sasrec train.seed=42 --variant sasrec_defaults_s1 model.name=sasrec \
    train.seed=1 --variant sasrec_defaults_s2 model.name=sasrec train.seed=2 > "$out/defaults.log" 2>&1 &
wait
cat "$out/recipe.md" "$out/defaults.md"
