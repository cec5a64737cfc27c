#!/usr/bin/env bash
# Pipeline schedules side by side (issue 45, docs/training.md "Pipeline schedules"): for P stages
# (default 4) and 4, 8 and 16 microbatches, every schedule (1f1b, interleaved with 2 chunks, zb-h1,
# zb-v; gpipe with --gpipe) runs the same model, and per run: the measured bubble (the mean over
# stages of each stage's median share of a step outside its F, B and W), the schedule's own bubble
# (pipeline::simulate with F = B = W), the step time (the slowest stage's median) and its ratio to
# 1f1b's in the same round, and the chunk activations each stage holds with their planned bytes at
# the peak (--plan, the same model). Prints a Markdown table.
#
#   scripts/dev/bench_schedules.sh [--stages 4] [--rounds 3] [--steps 6] [--gpipe]
#
# Each round runs every configuration once, interleaved; every figure is the median over rounds.
# Model: 8 blocks, d_model 128, d_ff 512, heads 4 of 32, batch 64 x length 64, vocab 256 (the
# bubble table of docs/scale.md). One process per stage, OMP_NUM_THREADS=1, mpiexec --mca
# mpi_yield_when_idle 1 (a stage waiting for its neighbour yields its core). With more stages than
# cores, stages share cores and a stage's neighbours slow it: say so with the figures.
# MESHTENSOR_BUILD_DIR (default build/training) chooses the build of meshtensor-lm.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
stages=4 rounds=3 steps=6 gpipe=0
bench_args "$0" 2,18 --stages:stages --rounds:rounds --steps:steps --gpipe:gpipe=1 -- "$@"
build=${MESHTENSOR_BUILD_DIR:-$root/build/training}
bench_build_target "$build" meshtensor-lm
lm="$build/tools/lm/meshtensor-lm"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
model=(--layers 8 --d-model 128 --d-ff 512 --heads 4 --d-kv 32 --batch 64 --length 64)
schedules=(1f1b "interleaved --chunks 2" zb-h1 zb-v)
[ "$gpipe" = 1 ] && schedules=(gpipe "${schedules[@]}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "CPU: $(lscpu | sed -n "s/^Model name: *//p"), $(getconf _NPROCESSORS_ONLN) cores; load average $(cut -d' ' -f1-3 /proc/loadavg);" \
     "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $stages stages, $rounds rounds of $steps steps"
for round in $(seq "$rounds"); do
  for m in 4 8 16; do
    for s in "${schedules[@]}"; do
      key="$m ${s%% *}"
      # shellcheck disable=SC2086
      out=$(mpiexec --mca mpi_yield_when_idle 1 -n "$stages" "$lm" --pipeline "$stages" --mesh 1 1 --schedule $s \
              --microbatches "$m" --steps "$steps" "${model[@]}" --log-every 100000 --csv "$tmp/loss.csv" 2>&1) || {
        echo "$out" >&2; exit 1; }
      echo "$key $(sed -n 's/^pipeline_bubble_measured_mean \([0-9.]*\) formula \([0-9.]*\)/\1 \2/p' <<<"$out")" \
           "$(sed -n 's/^pipeline_step_seconds_median //p' <<<"$out")" >>"$tmp/runs"
    done
  done
  echo "[bench_schedules] round $round of $rounds done" >&2
done

# The planned chunk activations per stage: held at the peak, and their bytes.
for m in 4 8 16; do
  for s in "${schedules[@]}"; do
    # shellcheck disable=SC2086
    "$lm" --plan --pipeline "$stages" --mesh 1 1 --schedule $s --microbatches "$m" "${model[@]}" |
      awk -v key="$m ${s%% *}" '$1 ~ /^[0-9]+$/ && NF >= 6 { held = held sep $2; act = act sep $7; sep = " " }
                               END { print key "|" held "|" act }' >>"$tmp/plans"
  done
done

python3 - "$tmp/runs" "$tmp/plans" "$rounds" <<'PY'
import statistics, sys
runs, plans = {}, {}
for line in open(sys.argv[1]):
    m, s, measured, simulated, step = line.split()
    runs.setdefault((int(m), s), []).append((float(measured), float(simulated), float(step)))
for line in open(sys.argv[2]):
    key, held, act = line.rstrip("\n").split("|")
    m, s = key.split()
    plans[(int(m), s)] = (held, act)
print("| microbatches | schedule | bubble measured | schedule's (F = B = W) | step (s) | vs 1f1b | chunk activations held per stage | their MiB at the peak (planned) |")
print("|---|---|---|---|---|---|---|---|")
for (m, s), r in sorted(runs.items(), key=lambda kv: (kv[0][0], ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"].index(kv[0][1]))):
    med = lambda i: statistics.median(x[i] for x in r)
    base = statistics.median(x[2] for x in runs[(m, "1f1b")])
    held, act = plans.get((m, s), ("?", ""))
    held = held.replace(" ", ", ")
    act = ", ".join(f"{float(g) * 1024:.0f}" for g in act.split())  # GiB with 3 decimals: about 1 MiB
    print(f"| {m} | {s} | {med(0):.3f} | {med(1):.3f} | {med(2):.3f} | {med(2) / base:.2f} | {held} | {act} |")
PY
