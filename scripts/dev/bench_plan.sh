#!/usr/bin/env bash
# Plan mode against the clock (docs/plan-mode.md, issue 14 items 2 and 4): for 1, 2 and 4 ranks,
# measures this machine once (bench_calibrate), then for the Transformer LM and the Fashion-MNIST
# MLP under each of their layouts, the median measured step time against the step time predicted
# from a planned run (--plan --calibration; for the MLP, the fashion_mnist example's model, its checks
# program's --predict --calibration). Then, at 4 ranks, whether the layout ranked first by
# the prediction (--rank-layouts) is within 10% of the fastest measured. Prints Markdown tables and
# writes benchmarks/results/plan-<date>.json.
#
#   OPENBLAS_CORETYPE=SkylakeX scripts/dev/bench_plan.sh [--rounds 3]
#
# LM: batch 8, length 128, d_model 256, heads 4 (d_kv 64), d_ff 1024, vocab 256, 2 layers, Adam;
# median of 20 steps after 5 warm-up steps. MLP: fashion_mnist's default (784-256-10, batch 128,
# Adam), 300 steps, the mean step (its steps/s). Each number is the median over the rounds.
# OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1 per rank; OPENBLAS_CORETYPE is read, never set. Refuses to
# time on a loaded machine (load average above 0.5 per core); MESHTENSOR_BUILD_DIR (default
# build/plan) chooses the build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=3
bench_args "$0" 2,16 --rounds:rounds -- "$@"
log() { echo "[bench_plan] $*" >&2; }
build=${MESHTENSOR_BUILD_DIR:-$root/build/plan}
bench_build_target "$build" meshtensor-lm fashion_mnist fashion_mnist_checks bench_calibrate
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_PROC_BIND=false OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

cores=$(getconf _NPROCESSORS_ONLN)
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" -v c="$cores" 'BEGIN { exit !(l > 0.5 * c) }'; then
  log "load average $load on $cores cores: the machine is busy; timings would be wrong. Stopping."
  exit 3
fi
log "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}; load average $load on $cores cores"

out=$(mktemp -d)
lm="$build/tools/lm/meshtensor-lm" mlp="$build/examples/fashion_mnist" mlp_checks="$build/examples/checks/fashion_mnist_checks"
lm_args=(--batch 8 --length 128 --d-model 256 --heads 4 --d-kv 64 --d-ff 1024 --vocab 256)

rows=()
for ranks in 1 2 4; do
  case $ranks in 1) mesh=(1 1) ;; 2) mesh=(2 1) ;; 4) mesh=(2 2) ;; esac
  cal="$out/calibration-$ranks.txt"
  mpiexec -n "$ranks" "$build/benchmarks/bench_calibrate" --out "$cal" >&2
  for model in lm mlp; do
    for layout in data model 2d; do
      measured=()
      for ((r = 0; r < rounds; r++)); do
        if [ $model = lm ]; then
          measured+=("$(mpiexec -n "$ranks" "$lm" --layout $layout --mesh "${mesh[@]}" "${lm_args[@]}" --steps 25 \
                        --warmup 5 --log-every 1000 --csv "$out/loss.csv" | sed -n 's/^step_time_median_ms \([0-9.]*\).*/\1/p')")
        else
          sps=$(mpiexec -n "$ranks" "$mlp" --layout $layout --mesh "${mesh[@]}" --steps 300 --log-every 1000 \
                  --test-examples 0 | sed -n 's/.*(\([0-9.]*\) steps\/s.*/\1/p')
          measured+=("$(awk -v s="$sps" 'BEGIN { printf "%.4f", 1000 / s }')")
        fi
      done
      m=$(printf '%s\n' "${measured[@]}" | median)
      if [ $model = lm ]; then
        p=$("$lm" --plan --layout $layout --mesh "${mesh[@]}" "${lm_args[@]}" --calibration "$cal" \
              | sed -n 's/^predicted step time \([0-9.]*\) ms.*/\1/p')
      else
        p=$("$mlp_checks" --predict --layout $layout --mesh "${mesh[@]}" --calibration "$cal" \
              | sed -n 's/^predicted step time \([0-9.]*\) ms.*/\1/p')
      fi
      rows+=("$model $ranks $layout $m $p")
      log "$model np$ranks $layout: measured $m ms, predicted $p ms"
    done
  done
done

echo "| model | ranks | layout | measured step (ms) | predicted (ms) | error |"
echo "|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  read -r model ranks layout m p <<< "$row"
  awk -v mo="$model" -v r="$ranks" -v l="$layout" -v m="$m" -v p="$p" \
    'BEGIN { printf "| %s | %s | %s | %.2f | %.2f | %+.0f%% |\n", (mo == "lm" ? "Transformer LM" : "MLP"), r, l, m, p, 100 * (p - m) / m }'
done

echo
echo "| model (4 ranks) | ranked first | its measured step | fastest measured | within 10% |"
echo "|---|---|---|---|---|"
for model in lm mlp; do
  if [ $model = lm ]; then
    first=$("$lm" --rank-layouts --mesh 2 2 "${lm_args[@]}" --calibration "$out/calibration-4.txt" | sed -n 's/^best: --layout \([a-z0-9]*\).*/\1/p')
  else
    first=$("$mlp_checks" --rank-layouts --mesh 2 2 --calibration "$out/calibration-4.txt" | sed -n 's/^best: --layout \([a-z0-9]*\).*/\1/p')
  fi
  printf '%s\n' "${rows[@]}" | awk -v mo="$model" -v f="$first" '
    $1 == mo && $2 == 4 { t[$3] = $4; if (best == "" || $4 < t[best]) best = $3 }
    END { ok = t[f] <= 1.1 * t[best]; printf "| %s | %s | %.2f ms | %s, %.2f ms | %s |\n",
          (mo == "lm" ? "Transformer LM" : "MLP"), f, t[f], best, t[best], ok ? "yes" : "NO" }'
done

mkdir -p "$root/benchmarks/results"
json="$root/benchmarks/results/plan-$(date +%Y-%m-%d).json"
{
  echo "{\"openblas_coretype\": \"${OPENBLAS_CORETYPE:-}\", \"load_before\": \"$load\", \"rounds\": $rounds, \"cases\": ["
  sep=""
  for row in "${rows[@]}"; do
    read -r model ranks layout m p <<< "$row"
    echo "$sep{\"model\": \"$model\", \"ranks\": $ranks, \"layout\": \"$layout\", \"measured_ms\": $m, \"predicted_ms\": $p}"
    sep=","
  done
  echo "], \"calibration\": {"
  sep=""
  for ranks in 1 2 4; do
    echo "$sep\"$ranks\": \"$(grep -v '^#' "$out/calibration-$ranks.txt" | tr '\n' ';')\""
    sep=","
  done
  echo "}}"
} > "$json"
log "written $json"
