#!/usr/bin/env bash
# conv2d forward + backward: meshtensor (benchmarks/bench_conv.cpp) against PyTorch's conv2d on one
# thread (benchmarks/peers/torch_conv.py), and meshtensor's split image at 2 and 4 ranks against 1.
#
#   OPENBLAS_CORETYPE=... scripts/dev/bench_conv.sh [--rounds N] [BUILD_DIR]
#
# BUILD_DIR (default $MESHTENSOR_BUILD_DIR or build/bench) is configured where it is not yet, and
# bench_conv is built there. MESHTENSOR_KERNELS=portable times the portable path (unfold + sgemm)
# where the build has oneDNN. Rounds interleave the runs; each figure is the median over the rounds of each run's median.
# OPENBLAS_CORETYPE is read, never set, and printed with the load average before and after.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=5
if [ "${1:-}" = "--rounds" ]; then rounds="$2"; shift 2; fi
build=${1:-${MESHTENSOR_BUILD_DIR:-$root/build/bench}}
log() { echo "[bench_conv] $*" >&2; }
# A tree of its own, configured here where it is not yet (at the build type's -O3, with the
# kernels this machine has: oneDNN where installed).
bench_build_target "$build" bench_conv -- -DMESHTENSOR_BUILD_TESTS=OFF
# Open MPI refuses root and more ranks than cores unless told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average before: $load_before (1-minute above 0.5: the figures are not from a quiet machine)"
raw=$(mktemp -d)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
for r in $(seq 1 "$rounds"); do
  for np in 1 2 4; do
    log "round $r/$rounds: meshtensor, $np rank(s)"
    mpiexec -n "$np" "$build/benchmarks/bench_conv" --benchmark_out="$raw/ours-np$np-$r.json" \
      --benchmark_out_format=json >/dev/null 2>>"$raw/stderr.log"
  done
  log "round $r/$rounds: PyTorch"
  /usr/bin/python3 "$root/benchmarks/peers/torch_conv.py" >"$raw/torch-$r.json"
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$raw" "$rounds" <<'PY'
import glob, json, os, statistics, sys
raw, rounds = sys.argv[1], int(sys.argv[2])
ours = {}  # (shape, np) -> [seconds per round]
for f in glob.glob(f"{raw}/ours-np*-*.json"):
    np_ = int(os.path.basename(f).split("-")[1][2:])
    for b in json.load(open(f))["benchmarks"]:
        ours.setdefault((b["name"].split("/")[2], np_), []).append(b["real_time"] / 1e3)
torch = {}
for f in glob.glob(f"{raw}/torch-*.json"):
    for line in open(f):
        e = json.loads(line)
        torch.setdefault(e["name"].split("/")[2], []).append(e["seconds"])
print(f"conv2d 3x3 same, forward + backward, float32, medians of {rounds} rounds (ms); "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
print(f"{'batch x hw x channels':>22} {'PyTorch 1 thread':>17} {'ours 1 rank':>12} {'ours/PyTorch speed':>19} "
      f"{'ours 2 ranks':>13} {'ours 4 ranks':>13} {'2 vs 1':>7} {'4 vs 1':>7}")
for shape in sorted({k[0] for k in ours}, key=lambda s: [int(v) for v in s.split("x")]):
    m = {np_: statistics.median(ours[(shape, np_)]) for np_ in (1, 2, 4) if (shape, np_) in ours}
    t = statistics.median(torch[shape]) if shape in torch else float("nan")
    print(f"{shape:>22} {t*1e3:17.2f} {m[1]*1e3:12.2f} {t/m[1]:18.2f}x {m.get(2, float('nan'))*1e3:13.2f} "
          f"{m.get(4, float('nan'))*1e3:13.2f} {m[1]/m.get(2, float('nan')):6.2f}x {m[1]/m.get(4, float('nan')):6.2f}x")
PY
log "load average after: $load_after; cores: $(nproc --all)"
rm -rf "$raw"
