#!/usr/bin/env bash
# The Jacobi example (examples/jacobi) against PETSc's DMDA version of the same solver
# (benchmarks/peers/petsc_jacobi.cpp), side by side at 1, 2 and 4 ranks on the same process grids
# ([1 x 1], [2 x 1], [2 x 2]; x over rows, y over cols, z whole).
#
#   scripts/dev/bench_jacobi.sh [--rounds N] [--size "NX NY NZ"] [--steps N] [--build DIR]
#
# DIR (default $MESHTENSOR_BUILD_DIR or build/bench) is configured where it is not yet, and
# jacobi and petsc_jacobi are built there (petsc_jacobi only where PETSc is installed: Debian's
# libpetsc-real-dev). Rounds interleave the two; each figure is the median over the rounds. Both
# print the residual after the iterations, which must agree (the same problem, the same arithmetic).
# The load average is printed before and after; more ranks than cores time a shared CPU.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=5 size="96 96 96" steps=100 build=${MESHTENSOR_BUILD_DIR:-$root/build/bench}
bench_args "$0" 2,12 --rounds:rounds --size:size --steps:steps --build:build -- "$@"
log() { echo "[bench_jacobi] $*" >&2; }
bench_side_by_side bench_jacobi "$build" jacobi petsc_jacobi "PETSc: libpetsc-real-dev"
read -r nx ny nz <<<"$size"
raw=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  for mesh in "1 1" "2 1" "2 2"; do
    read -r px py <<<"$mesh"
    np=$((px * py))
    mpiexec -n "$np" "$build/examples/jacobi" --size $nx $ny $nz --steps "$steps" --log-every "$steps" --mesh $px $py \
      >"$raw/ours-$np-$r.log"
    mpiexec -n "$np" "$build/benchmarks/petsc_jacobi" "$nx" "$ny" "$nz" "$steps" "$px" "$py" >"$raw/petsc-$np-$r.log"
  done
done
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$raw" "$rounds" "$size" "$steps" <<'PY'
import re, statistics, sys
raw, rounds, size, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def read(kind, np, r):
    text = open(f"{raw}/{kind}-{np}-{r}.log").read()
    seconds = float(re.search(r"iterations in ([0-9.]+) s", text).group(1))
    residual = re.findall(r"residual ([0-9.e+-]+)", text)[-1]
    return seconds, residual
print(f"Jacobi on {size} points, {steps} iterations, double: median seconds over {rounds} rounds")
print("| ranks | meshtensor (s) | PETSc DMDA (s) | meshtensor / PETSc | residual (both) |")
print("|---|---|---|---|---|")
bad = False
for np in (1, 2, 4):
    ours = [read("ours", np, r) for r in range(1, rounds + 1)]
    theirs = [read("petsc", np, r) for r in range(1, rounds + 1)]
    a, b = statistics.median(s for s, _ in ours), statistics.median(s for s, _ in theirs)
    residuals = {res for _, res in ours + theirs}
    bad |= len(residuals) != 1
    print(f"| {np} | {a:.3f} | {b:.3f} | {a / b:.2f} | {', '.join(sorted(residuals))} |")
if bad:
    print("the residuals differ: the two programs do not solve the same problem the same way")
    sys.exit(1)
PY
