#!/usr/bin/env bash
# One device call on one H200 (about 3.5 min; at most 80 + 5 + 60 + 120 s): this branch's attention
# kernels against main's.
#   1. the attention GPU tests (fixed configs, no autotuning);
#   2. bench_attention.py with main's kernels (`git archive main recsys`, untracked, first on
#      PYTHONPATH), ours only;
#   3. the same bench with this branch's kernels, ours + SDPA-with-mask + FlexAttention, ending with
#      the launch / graph ratio tables and a before/after table of ours.
#
#   bash experiments/gpu_attn_long.sh OUT_DIR
#
# The device copy of the tree may lack .git: prepare main's copy where git is (untracked, not
# ignored, so it travels with the working tree), then run the script there:
#   rm -rf .main_kernels && mkdir .main_kernels && git archive main recsys | tar -x -C .main_kernels
set -uo pipefail
out=${1:?output folder}; mkdir -p "$out/main" "$out/branch"
main_copy=.main_kernels
if [ ! -d "$main_copy/recsys" ]; then
    mkdir -p "$main_copy" && git archive main recsys | tar -x -C "$main_copy" || { echo "no copy of main's recsys"; exit 1; }
fi
export PYTHONUNBUFFERED=1
PYTHONPATH="$PWD" RECSYS_ATTN_AUTOTUNE=0 timeout 80 python -m pytest -q -m gpu -n 8 -p no:cacheprovider \
    tests/kernels/test_attention.py tests/kernels/test_ops.py -k "attention" > "$out/gpu_tests.log" 2>&1
echo "attention gpu tests exit $?" >> "$out/gpu_tests.log"
tail -n 4 "$out/gpu_tests.log"
sleep 5  # let the test processes' GPU work drain before timing
# the bench writes its JSON after every shape, so a timeout keeps the shapes done
PYTHONPATH="$PWD/$main_copy" timeout 60 python experiments/bench_attention.py --methods ours --out "$out/main" \
    > "$out/main/bench.log" 2>&1
echo "main bench exit $?"
grep -E "kernels from|^  ours" "$out/main/bench.log" | cut -c1-400
before=()
[ -f "$out/main/bench_attention.json" ] && before=(--before "$out/main/bench_attention.json")
PYTHONPATH="$PWD" timeout 120 python experiments/bench_attention.py --methods ours,sdpa-mask,flex --out "$out/branch" \
    ${before[@]+"${before[@]}"} 2>&1 | tee "$out/branch/bench.log" | grep -vE "^  (sdpa|flex)"
echo "branch bench exit ${PIPESTATUS[0]}"
