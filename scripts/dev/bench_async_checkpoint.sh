#!/usr/bin/env bash
# Asynchronous against synchronous checkpoints (docs/performance.md, "Checkpoints while training"):
# meshtensor-lm saving every 4 steps, --layout fsdp (each rank writes its share), on 1, 2 and 4
# ranks, at two sizes: the default model (d_model 64, 2 layers) and a larger one (d_model 512,
# d_ff 2048, 4 layers, vocab 8192). For each, in the same round, a run with synchronous saves and
# one with --async-save; the LM reports the time a save blocks its step and the median step time
# of the other steps with a save in flight or none. Figures: medians over --rounds rounds (default 3).
#   scripts/dev/bench_async_checkpoint.sh [--rounds 3] [--ranks "1 2 4"] [--steps 24] [--build DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=3 ranks_list="1 2 4" steps=24 build=$root/build/bench
bench_args "$0" 2,9 --rounds:rounds --ranks:ranks_list --steps:steps --build:build -- "$@"
bench_build_target "$build" meshtensor-lm
lm=$build/tools/lm/meshtensor-lm
[ -x "$lm" ] || lm=$(find "$build" -name meshtensor-lm -type f -perm -u+x | head -n 1)
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
declare -A sizes=([default]="" [larger]="--d-model 512 --d-ff 2048 --layers 4 --vocab 8192")

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); load average before: $(cut -d' ' -f1-3 /proc/loadavg); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo
echo "| model | ranks | state MB per rank | sync: blocked ms | async: blocked ms | async / sync | step ms, no save | step ms, save in flight |"
echo "|---|---|---|---|---|---|---|---|"
for size in default larger; do
  for p in $ranks_list; do
    declare -a sb=() ab=() idle=() busy=()
    state=""
    for _ in $(seq "$rounds"); do
      for mode in sync async; do
        rm -rf "$work/ckpt"
        extra=()
        [ "$mode" = async ] && extra=(--async-save)
        # shellcheck disable=SC2086
        out=$(mpiexec --allow-run-as-root --oversubscribe -n "$p" "$lm" --layout fsdp --mesh "$p" 1 --steps "$steps" \
              --log-every 1000 --memory --checkpoint "$work/ckpt" --save-every 4 ${sizes[$size]} "${extra[@]}" 2>&1) ||
          { echo "$out" >&2; exit 1; }
        line=$(grep '^checkpoint_blocked_ms' <<<"$out")
        blocked=$(awk '{ print $2 }' <<<"$line")
        state=$(sed -n 's/^memory_params_adam_bytes_per_rank max \([0-9]*\).*/\1/p' <<<"$out")
        if [ "$mode" = sync ]; then
          sb+=("$blocked")
          idle+=("$(sed -n 's/.*, \([0-9.]*\) without.*/\1/p' <<<"$line")")
        else
          ab+=("$blocked")
          busy+=("$(sed -n 's/.*step_ms \([0-9.]*\) with a save in flight.*/\1/p' <<<"$line")")
        fi
      done
    done
    s=$(printf '%s\n' "${sb[@]}" | median) a=$(printf '%s\n' "${ab[@]}" | median)
    i=$(printf '%s\n' "${idle[@]}" | median) b=$(printf '%s\n' "${busy[@]}" | median)
    printf '| %s | %s | %.1f | %.1f | %.1f | %.3f | %.1f | %.1f |\n' "$size" "$p" "$(awk -v b="$state" 'BEGIN { print b / 1e6 }')" \
      "$s" "$a" "$(awk -v a="$a" -v s="$s" 'BEGIN { print a / s }')" "$i" "$b"
  done
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
