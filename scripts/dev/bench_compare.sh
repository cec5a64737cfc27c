#!/usr/bin/env bash
# Two builds of meshtensor side by side in one run, for a change that must not slow the common path
# (docs/performance.md): the communication benchmarks (bench_comm, meshtensor's side only) at 2
# ranks and the Transformer training step (tools/lm, meshtensor-lm: batch 8, length 128, d_model
# 256, heads 4, d_kv 64, d_ff 1024, vocab 1024, Adam) at 1 and 2 ranks, each configuration of the
# two builds run alternately, --rounds times; every figure is the median over the rounds.
#   OPENBLAS_CORETYPE=SkylakeX scripts/dev/bench_compare.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR [--rounds 5]
#     [--filter REGEX]   (bench_comm benchmarks; default relayout, gather_relayout, reduce_sum)
# Each build dir must hold benchmarks/bench_comm and tools/lm/meshtensor-lm (e.g. a worktree of
# the old commit configured like scripts/dev/bench.sh, and build/bench). OPENBLAS_CORETYPE is read, never set.
set -euo pipefail
before=$1 after=$2
shift 2
rounds=5 filter='^(relayout|gather_relayout|reduce_sum)/ours/(262144|4194304|67108864)/'
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    *) echo "bench_compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
model=(--batch 8 --length 128 --d-model 256 --heads 4 --d-kv 64 --d-ff 1024 --vocab 1024 --steps 13 --warmup 3
       --log-every 1000 --csv "$tmp/loss.csv")
for r in $(seq "$rounds"); do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    mpiexec -n 2 "$dir/benchmarks/bench_comm" --benchmark_filter="$filter" --benchmark_format=csv 2>/dev/null |
      awk -F, -v s="$side" '/^"/ { gsub(/"/, "", $1); sub(/\/iterations.*/, "", $1); print s, $1, $3 }' >>"$tmp/comm"
    for n in 1 2; do
      t=$(mpiexec -n "$n" "$dir/tools/lm/meshtensor-lm" --layout data --mesh "$n" 1 "${model[@]}" |
          sed -n 's/^step_time_median_ms \([0-9.]*\).*/\1/p')
      echo "$side step_np$n $t" >>"$tmp/comm"
    done
  done
done
echo
echo "| benchmark | before | after | after / before |"
echo "|---|---|---|---|"
for name in $(awk '{print $2}' "$tmp/comm" | awk '!seen[$0]++'); do
  b=$(awk -v n="$name" '$1 == "before" && $2 == n {print $3}' "$tmp/comm" | median)
  a=$(awk -v n="$name" '$1 == "after" && $2 == n {print $3}' "$tmp/comm" | median)
  unit=us; case "$name" in step_*) unit=ms ;; esac
  echo "| $name | $b $unit | $a $unit | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }') |"
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
