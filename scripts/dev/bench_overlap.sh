#!/usr/bin/env bash
# A step with and without one kind of communication overlap, side by side in one run, at 2 and 4
# ranks, one thread per rank; with the plan's prediction of the exposed communication for each on
# the calibration given (--calibration FILE: a GPU's, from scripts/dev/published_plans.py's
# gpu_calibration or bench_calibrate; none: no prediction). Prints a Markdown table
# (docs/performance.md, "Tensor-parallel overlap" and "Sharded weights' reduce_scatters behind the
# backward pass").
#   --kind tp:   sequence parallelism's collectives with the products (meshtensor-lm
#                --sequence-parallel [--tp-overlap | --tp-overlap-qkv]: einsum_gathered,
#                einsum_gathered_each, einsum_scattered); layout model on [1 x N] (heads and d_ff over
#                N, the residual stream split along length over N).
#   --kind fsdp: the weights' reduce_scatters behind the backward pass (--layout fsdp --zero 3
#                [--overlap-grad-reduce]) on [N x 1] (the batch and the stored weights over N).
#   --kind progress: how MPI moves behind the work: the data layout's gradient allreduces blocking,
#                started and polled from the tape (--overlap-grad-reduce), and started with the
#                progress thread beside the polling (MESHTENSOR_PROGRESS_THREAD=--progress-us,
#                default 100), on [N x 1].
#
#   scripts/dev/bench_overlap.sh --kind tp|fsdp|progress [--rounds 5] [--steps 8] [--warmup 2]
#                                [--calibration FILE] [--progress-us 100]
#
# Each round runs every configuration once, interleaved; each run's figure is meshtensor-lm's
# median step time after its warm-up; the table holds the median over the rounds (min and max
# beside) and the ratio to the same ranks without the overlap. Model: the larger one of
# bench_training.sh (batch 8, length 256, d_model 512, 8 heads of 64, d_ff 2048, vocabulary
# 8192, 2 layers), float32, Adam. MESHTENSOR_BUILD_DIR (default build/bench) and
# MESHTENSOR_BUILD_JOBS choose where and how meshtensor-lm is built (Release).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
kind="" rounds=5 steps=8 warmup=2 calibration="" progress_us=100
bench_args "$0" 2,28 --kind:kind --rounds:rounds --steps:steps --warmup:warmup --calibration:calibration \
  --progress-us:progress_us -- "$@"
build=${MESHTENSOR_BUILD_DIR:-$root/build/bench}
bench_build_target "$build" meshtensor-lm -- -DMESHTENSOR_BUILD_TESTS=OFF
lm="$build/tools/lm/meshtensor-lm"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
echo "[bench_overlap] CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
model=(--batch 8 --length 256 --d-model 512 --heads 8 --d-kv 64 --d-ff 2048 --vocab 8192 --layers 2)
case "$kind" in
  tp)
    model+=(--layout model --sequence-parallel)
    mesh() { echo 1 "$1"; }
    configs=("2" "2 --tp-overlap" "2 --tp-overlap-qkv" "4" "4 --tp-overlap" "4 --tp-overlap-qkv") ;;
  fsdp)
    model+=(--layout fsdp --zero 3)
    mesh() { echo "$1" 1; }
    configs=("2" "2 --overlap-grad-reduce" "4" "4 --overlap-grad-reduce") ;;
  progress)
    model+=(--layout data)
    mesh() { echo "$1" 1; }
    configs=("2" "2 --overlap-grad-reduce" "2 --overlap-grad-reduce --progress-thread"
             "4" "4 --overlap-grad-reduce" "4 --overlap-grad-reduce --progress-thread") ;;
  *) echo "bench_overlap.sh: --kind '$kind': give tp, fsdp or progress" >&2; exit 2 ;;
esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --progress-thread is this script's: the progress thread's variable, not a flag of meshtensor-lm.
# progress_env FLAG...: the environment it asks for; lm_flags FLAG...: the rest.
progress_env() { for a in "$@"; do [ "$a" != --progress-thread ] || echo "MESHTENSOR_PROGRESS_THREAD=$progress_us"; done; }
lm_flags() { for a in "$@"; do [ "$a" = --progress-thread ] || echo "$a"; done; }
# run RANKS [FLAG]: the median step time (ms) after the warm-up
run() {
  local n=$1
  shift
  # shellcheck disable=SC2046
  env $(progress_env "$@") mpiexec -n "$n" "$lm" "${model[@]}" --mesh $(mesh "$n") --steps $((warmup + steps)) --warmup "$warmup" \
    --log-every 100000 --csv "$tmp/loss.csv" $(lm_flags "$@") 2>&1 | sed -n 's/^step_time_median_ms \([0-9.]*\).*/\1/p'
}
# planned RANKS [FLAG]: "exposed hidden" communication (ms) the plan predicts on the calibration
planned() {
  local n=$1
  shift
  [ -n "$calibration" ] || { echo "- -"; return; }
  # shellcheck disable=SC2046
  "$lm" --plan "${model[@]}" --mesh $(mesh "$n") --calibration "$calibration" $(lm_flags "$@") |
    awk '/^predicted step time/ { for (i = 1; i <= NF; ++i) if ($i == "communication") e = $(i + 1); h = 0
                                  for (i = 1; i <= NF; ++i) if ($i == "more" && $(i + 1) == "hidden") h = $(i - 1)
                                  gsub(/[(,]/, "", e); gsub(/[(,]/, "", h); print e, h }'
}
declare -A got
for round in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    got[$c]+="$(run $c) "
    echo "[bench_overlap] round $round, $c: ${got[$c]}" >&2
  done
done
echo "| ranks | overlap | step ms (median of $rounds rounds; min, max) | against without | planned exposed / hidden communication, ms (${calibration:-no calibration}) |"
echo "|---|---|---|---|---|"
for c in "${configs[@]}"; do
  read -r n flag <<<"$c"
  m=$(tr ' ' '\n' <<<"${got[$c]}" | grep . | median)
  base=$(tr ' ' '\n' <<<"${got[$n]}" | grep . | median)
  lo=$(tr ' ' '\n' <<<"${got[$c]}" | grep . | sort -g | head -1)
  hi=$(tr ' ' '\n' <<<"${got[$c]}" | grep . | sort -g | tail -1)
  # shellcheck disable=SC2086
  read -r exposed hidden <<<"$(planned $c)"
  awk -v n="$n" -v f="${flag:-no}" -v m="$m" -v b="$base" -v lo="$lo" -v hi="$hi" -v e="$exposed" -v h="$hidden" \
    'BEGIN { printf "| %d | %s | %.1f (%.1f, %.1f) | %.3f | %s / %s |\n", n, (f == "no" ? "none" : "`" f "`"), m, lo, hi, m / b, e, h }'
done
echo "[bench_overlap] load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
