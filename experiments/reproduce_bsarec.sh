#!/usr/bin/env bash
# BSARec's logged Amazon Beauty run reproduced inside recsys, under its own rules (leave-one-out, every
# user scored: data.loo_rules = "every_user"), beside recsys's sasrec at its defaults under the same rules
# (docs/results.md, "The BSARec lineage's rules"):
#
#   bash experiments/reproduce_bsarec.sh [DATA] [OUT_DIR] [MINUTES]
#
# DATA: Amazon Beauty's interactions.csv (default ../shared/data/amazon-beauty/interactions.csv);
# OUT_DIR: tables, logs and runs (default /tmp/reproduce_bsarec); MINUTES: each run's training cap
# (default 8). The recipe (experiments/configs/recipes/bsarec.toml) runs at seeds 42, 1 and 2, and
# at seed 42 three ablations: attention alone (the lineage's SASRec), no attention dropout (attention on
# the kernels), and fp32 (no bf16 autocast). All runs share the machine, one process each.
set -uo pipefail
data=${1:-../shared/data/amazon-beauty/interactions.csv}
out=${2:-/tmp/reproduce_bsarec}
minutes=${3:-8}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
common=(--data "$data" --models "" --rules every_user --set "train.max_minutes=$minutes")
python3 experiments/loo_beauty.py "${common[@]}" --config experiments/configs/recipes/bsarec.toml --jobs 6 \
    --output-dir "$out/runs" --results "$out/recipe.md" \
    --variant bsarec_s42 train.seed=42 --variant bsarec_s1 train.seed=1 --variant bsarec_s2 train.seed=2 \
    --variant attention_only_s42 model.mixer=attention \
    --variant no_attention_dropout_s42 model.attention_dropout=0 \
    --variant fp32_s42 train.amp=false > "$out/recipe.log" 2>&1 &
python3 experiments/loo_beauty.py "${common[@]}" --jobs 1 --output-dir "$out/runs" --results "$out/defaults.md" \
    --variant sasrec_defaults_s42 model.name=sasrec > "$out/defaults.log" 2>&1 &
wait
cat "$out/recipe.md" "$out/defaults.md"
