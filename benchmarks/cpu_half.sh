#!/usr/bin/env bash
# Print the CPUs of one half of the machine's physical cores (hyperthread siblings kept together),
# as a list for `taskset -c`: `taskset -c "$(bash benchmarks/cpu_half.sh 0)" CMD` on one half,
# `... cpu_half.sh 1` on the other. Splitting `nproc` in two instead can put both halves on the same
# physical cores (siblings are often CPU i and i + N/2), and `nproc` obeys OMP_NUM_THREADS.
#
#   bash benchmarks/cpu_half.sh 0|1
set -euo pipefail
want=${1:?0 or 1}
lscpu -p=CPU,SOCKET,CORE | grep -v '^#' | awk -F, -v want="$want" '
    { key = $2 "," $3; if (!(key in rank)) rank[key] = n++; cpu[NR] = $1; of[NR] = key }
    END { sep = ""; for (i = 1; i <= NR; i++) if ((rank[of[i]] >= n / 2) == want) { printf "%s%s", sep, cpu[i]; sep = "," } print "" }'
