#!/usr/bin/env bash
# The spectral example (examples/spectral: a periodic Poisson solve by distributed FFTs, complex
# double) against FFTW-MPI's transform of the same array (benchmarks/peers/fftw_mpi_poisson.cpp),
# side by side at 1, 2 and 4 ranks: meshtensor's slabs on [P x 1] (one alltoall each way, FFTW-MPI's
# decomposition) and its pencils on [2 x 2] (two alltoalls each way, over one axis each).
#
#   scripts/dev/bench_fft.sh [--rounds N] [--size "NX NY NZ"] [--repeat N] [--build DIR] [--before BINARY]
#
# --before: a spectral program built from another commit, run in the same rounds (slabs and
# pencils) and reported beside the current one: a change measured side by side.
# DIR (default $MESHTENSOR_BUILD_DIR or build/bench) is configured where it is not yet, and spectral
# and fftw_mpi_poisson are built there (fftw_mpi_poisson only where FFTW's MPI library is
# installed: libfftw3-mpi-dev, `scripts/install_deps.sh --bench`). Rounds interleave the two; each
# figure is the median over the rounds of the time per solve (a forward and an inverse 3-D
# transform and a product). Bytes: what each rank hands to the exchanges per solve, counted by
# meshtensor's communicator, and FFTW-MPI's by a model of its transposes (the same convention: the
# block a rank keeps is included). Both must reach the exact solution (1e-10).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=5 size="128 128 128" repeat=10 build=${MESHTENSOR_BUILD_DIR:-$root/build/bench}
before=""
bench_args "$0" 2,18 --rounds:rounds --size:size --repeat:repeat --build:build --before:before -- "$@"
[ -z "$before" ] || [ -x "$before" ] || { echo "bench_fft.sh: --before $before: no such program" >&2; exit 2; }
log() { echo "[bench_fft] $*" >&2; }
bench_side_by_side bench_fft "$build" spectral fftw_mpi_poisson "FFTW-MPI: libfftw3-mpi-dev"
read -r nx ny nz <<<"$size"
raw=$(mktemp -d)
for r in $(seq 1 "$rounds"); do
  for np in 1 2 4; do
    mpiexec -n "$np" "$build/examples/spectral" --size $nx $ny $nz --repeat "$repeat" --layout slabs --mesh "$np" 1 \
      >"$raw/slabs-$np-$r.log"
    mpiexec -n "$np" "$build/benchmarks/fftw_mpi_poisson" "$nx" "$ny" "$nz" "$repeat" >"$raw/fftw-$np-$r.log"
    [ -z "$before" ] || mpiexec -n "$np" "$before" --size $nx $ny $nz --repeat "$repeat" --layout slabs --mesh "$np" 1 \
      >"$raw/before-slabs-$np-$r.log"
  done
  mpiexec -n 4 "$build/examples/spectral" --size $nx $ny $nz --repeat "$repeat" --layout pencils --mesh 2 2 \
    >"$raw/pencils-4-$r.log"
  [ -z "$before" ] || mpiexec -n 4 "$before" --size $nx $ny $nz --repeat "$repeat" --layout pencils --mesh 2 2 \
    >"$raw/before-pencils-4-$r.log"
done
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$raw" "$rounds" "$size" "$repeat" "$before" <<'PY'
import re, statistics, sys
raw, rounds, size, repeat, before = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def read(kind, np, r):
    text = open(f"{raw}/{kind}-{np}-{r}.log").read()
    line = re.search(r"solves in .*", text).group(0)
    ms = float(re.search(r"\(([0-9.]+) ms per solve\)", line).group(1))
    sent = int(re.search(r"bytes sent per rank per solve ([0-9]+)", line).group(1))
    error = float(re.search(r"exact solution ([0-9.e+-]+)", line).group(1))
    return ms, sent, error
def median(kind, np):
    runs = [read(kind, np, r) for r in range(1, rounds + 1)]
    return statistics.median(m for m, _, _ in runs), runs[0][1], max(e for _, _, e in runs)
print(f"Periodic Poisson by 3-D FFTs on {size} points, complex double: median ms per solve over {rounds} rounds "
      f"of {repeat} solves")
print("| ranks | meshtensor (ms) | FFTW-MPI (ms) | meshtensor / FFTW-MPI | bytes per rank: meshtensor / FFTW-MPI (model) | largest error |")
print("|---|---|---|---|---|---|")
bad = False
for np in (1, 2, 4):
    a, bytes_a, err_a = median("slabs", np)
    b, bytes_b, err_b = median("fftw", np)
    bad |= max(err_a, err_b) > 1e-10
    print(f"| {np} (slabs) | {a:.2f} | {b:.2f} | {a / b:.2f} | {bytes_a} / {bytes_b} | {max(err_a, err_b):.1e} |")
p, bytes_p, err_p = median("pencils", 4)
b, bytes_b, _ = median("fftw", 4)
bad |= err_p > 1e-10
print(f"| 4 (pencils, [2 x 2]) | {p:.2f} | {b:.2f} | {p / b:.2f} | {bytes_p} / {bytes_b} | {err_p:.1e} |")
if before:
    print(f"\nBeside {before} (the same rounds): median ms per solve")
    print("| ranks | before (ms) | now (ms) | now / before |")
    print("|---|---|---|---|")
    for kind, np in (("slabs", 1), ("slabs", 2), ("slabs", 4), ("pencils", 4)):
        b, _, err_b = median("before-" + kind, np)
        a, _, _ = median(kind, np)
        bad |= err_b > 1e-10
        print(f"| {np} ({kind}) | {b:.2f} | {a:.2f} | {a / b:.2f} |")
if bad:
    print("a solution is off by more than 1e-10: the programs do not solve the problem")
    sys.exit(1)
PY
