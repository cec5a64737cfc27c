#!/usr/bin/env bash
# What the collective watchdog costs: meshtensor-lm's median step time with
# MESHTENSOR_COLLECTIVE_TIMEOUT unset (MPI's blocking collectives) and set (every collective
# started nonblocking and polled, runtime/watchdog.hpp), side by side in interleaved rounds.
#
#   OPENBLAS_CORETYPE=... scripts/dev/bench_watchdog.sh [--rounds N] [BUILD_DIR]
#
# Two cases at 2 ranks, one thread each: the default small model (d_model 64: many small,
# latency-bound collectives, the watchdog's worst case) under the data and the 2d layouts, and a
# larger one (d_model 256, sequence 128) under 2d. Each figure is the median over the rounds of each
# run's median step; the ratio is on over off (the issue's bound: within 1.02). BUILD_DIR (default
# $MESHTENSOR_BUILD_DIR or build/bench) is configured where it is not yet, and meshtensor-lm built
# there. OPENBLAS_CORETYPE is read, never set; the load average is printed before and after.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=5
if [ "${1:-}" = "--rounds" ]; then rounds="$2"; shift 2; fi
build=${1:-${MESHTENSOR_BUILD_DIR:-$root/build/bench}}
log() { echo "[bench_watchdog] $*" >&2; }
bench_build_target "$build" meshtensor-lm -- -DMESHTENSOR_BUILD_TESTS=OFF
lm=$build/tools/lm/meshtensor-lm
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average before: $load_before; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(lscpu | sed -n 's/^Model name: *//p')"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
cases=("small-data|--layout data --mesh 2 1" "small-2d|--layout 2d --mesh 1 2"
       "large-2d|--layout 2d --mesh 1 2 --d-model 256 --d-ff 1024 --heads 8 --d-kv 32 --length 128")
step() {  # step on|off NAME ARGS...: the run's median step in ms
  local watchdog=(env -u MESHTENSOR_COLLECTIVE_TIMEOUT)
  [ "$1" = off ] || watchdog=(env MESHTENSOR_COLLECTIVE_TIMEOUT=600)
  "${watchdog[@]}" mpiexec -n 2 "$lm" "${@:3}" --steps 60 --warmup 10 --log-every 1000 --csv "$raw/$2.csv" \
    2>>"$raw/stderr.log" | sed -n 's/^step_time_median_ms \([0-9.]*\).*/\1/p'
}
for r in $(seq 1 "$rounds"); do
  for c in "${cases[@]}"; do
    name=${c%%|*}
    read -r -a args <<<"${c#*|}"
    log "round $r/$rounds: $name"
    order=(off on)
    [ $((r % 2)) = 1 ] || order=(on off)  # neither always second
    for mode in "${order[@]}"; do echo "$name $mode $(step "$mode" "$name" "${args[@]}")" >>"$raw/times"; done
  done
done
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-10s %12s %12s %8s\n" case "off (ms)" "on (ms)" "on/off"
for c in "${cases[@]}"; do
  name=${c%%|*}
  off=$(awk -v n="$name" '$1 == n && $2 == "off" { print $3 }' "$raw/times" | median)
  on=$(awk -v n="$name" '$1 == n && $2 == "on" { print $3 }' "$raw/times" | median)
  printf "%-10s %12.3f %12.3f %8.3f\n" "$name" "$off" "$on" "$(awk -v a="$on" -v b="$off" 'BEGIN { print a / b }')"
done
