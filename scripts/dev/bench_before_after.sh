#!/usr/bin/env bash
# Two builds of meshtensor's training programs side by side in one run, for a whole issue's
# before and after on the CPU (docs/performance.md): the Transformer step of
# scripts/dev/bench_training.sh (meshtensor-lm: batch 8, length 128, d_model 256, heads 4, d_kv 64,
# d_ff 1024, vocab 1024, 2 layers, Adam) at 1 rank in float32 and in bf16, its 2-rank scaling
# (data parallel, model parallel), the translation example's step (scripts/dev/bench_translation.sh's
# model, 1 rank) and the peak RSS of the 1-rank runs. Each configuration runs on the two builds
# alternately, --rounds times; every figure is the median over the rounds (each run's own figure is
# the median of its steps after the warm-up).
#
#   scripts/dev/bench_before_after.sh BEFORE_DIR AFTER_DIR [--rounds 5] [--steps 10]
#
# Each DIR is a build tree holding tools/lm/meshtensor-lm and examples/translation, configured as
# scripts/dev/bench_common.sh's bench_build_target does (Release, the examples at -O3), e.g. of a
# worktree of the old commit:
#   git worktree add /tmp/before COMMIT && cmake -S /tmp/before -B /tmp/before/build -DCMAKE_BUILD_TYPE=Release \
#     -DMESHTENSOR_EXAMPLE_OPTIMIZATION= -DMESHTENSOR_BUILD_TESTS=OFF -DKokkos_ROOT=... &&
#   cmake --build /tmp/before/build --target meshtensor-lm translation
# One thread per process; OPENBLAS_CORETYPE is read, never set.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
[ $# -ge 2 ] || { echo "usage: $0 BEFORE_DIR AFTER_DIR [--rounds 5] [--steps 10]" >&2; exit 2; }
before=$1 after=$2
shift 2
rounds=5 steps=10
bench_args "$0" 2,20 --rounds:rounds --steps:steps -- "$@"
for dir in "$before" "$after"; do
  for bin in tools/lm/meshtensor-lm examples/translation; do
    [ -x "$dir/$bin" ] || { echo "$0: no $bin in $dir (build it there first)" >&2; exit 1; }
  done
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
warmup=3
lm_model=(--batch 8 --length 128 --d-model 256 --heads 4 --d-kv 64 --d-ff 1024 --vocab 1024
          --steps $((warmup + steps)) --warmup "$warmup" --log-every 100000 --csv "$tmp/loss.csv")
tr_model=(--vocab 4000 --d-model 128 --heads 4 --d-kv 32 --d-ff 512 --layers 2 --src-length 32 --tgt-length 32
          --dropout 0.1 --lr 1e-3 --batch 32 --steps $((warmup + steps)) --warmup "$warmup" --log-every 100000
          --eval-every 100000 --data-dir "$tmp/translation-data")
step_ms() { sed -n 's/^step_time_median_ms \([0-9.]*\).*/\1/p' | head -n 1; }
record() { echo "$1 $2 $3" >>"$tmp/runs"; }  # side name value

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores, $(grep -q -w avx512f /proc/cpuinfo && echo AVX-512 || echo 'AVX2 only'); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# The translation corpus and tokenizer, made once by the after build (both read the same files).
"$after/examples/translation" "${tr_model[@]}" --steps 0 >/dev/null 2>&1 || true
for ((round = 1; round <= rounds; round++)); do
  echo "[bench_before_after] round $round/$rounds" >&2
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    lm=$dir/tools/lm/meshtensor-lm
    # 1 rank: run directly (a singleton MPI process) so that GNU time's peak RSS is the rank's own.
    out=$(/usr/bin/time -f "rss_kib %M" "$lm" --layout data --mesh 1 1 "${lm_model[@]}" 2>&1)
    record "$side" "step, 1 rank, float32 (ms)" "$(step_ms <<<"$out")"
    record "$side" "peak RSS, 1 rank, float32 (MiB)" "$(sed -n 's/^rss_kib //p' <<<"$out" | awk '{printf "%.1f", $1 / 1024}')"
    out=$(/usr/bin/time -f "rss_kib %M" "$lm" --layout data --mesh 1 1 "${lm_model[@]}" --dtype bf16 2>&1)
    record "$side" "step, 1 rank, bf16 (ms)" "$(step_ms <<<"$out")"
    record "$side" "peak RSS, 1 rank, bf16 (MiB)" "$(sed -n 's/^rss_kib //p' <<<"$out" | awk '{printf "%.1f", $1 / 1024}')"
    record "$side" "step, 2 ranks, data parallel (ms)" \
      "$(mpiexec -n 2 "$lm" --layout data --mesh 2 1 "${lm_model[@]}" 2>&1 | step_ms)"
    record "$side" "step, 2 ranks, model parallel (ms)" \
      "$(mpiexec -n 2 "$lm" --layout model --mesh 2 1 "${lm_model[@]}" 2>&1 | step_ms)"
    out=$(/usr/bin/time -f "rss_kib %M" "$dir/examples/translation" --layout data --mesh 1 1 "${tr_model[@]}" 2>&1)
    record "$side" "translation step, 1 rank (ms)" "$(step_ms <<<"$out")"
    record "$side" "peak RSS, translation, 1 rank (MiB)" "$(sed -n 's/^rss_kib //p' <<<"$out" | awk '{printf "%.1f", $1 / 1024}')"
  done
done
echo
values() {  # side name: that configuration's figures, one per round
  awk -v side="$1" -v n="$2" '$1 == side { s = $0; sub(/^[a-z]+ /, "", s); sub(/ [^ ]*$/, "", s); if (s == n) print $NF }' "$tmp/runs"
}
spread() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s - %s", lo, hi }'; }
echo "| configuration | before | min - max | after | min - max | after / before |"
echo "|---|---|---|---|---|---|"
while IFS= read -r name; do
  b=$(values before "$name" | median)
  a=$(values after "$name" | median)
  echo "| $name | $b | $(values before "$name" | spread) | $a | $(values after "$name" | spread) |" \
       "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }') |"
done < <(cut -d' ' -f2- "$tmp/runs" | sed 's/ [^ ]*$//' | awk '!seen[$0]++')
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
