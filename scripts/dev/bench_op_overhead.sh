#!/usr/bin/env bash
# One op's cost against PyTorch eager's, one rank, one thread: benchmarks/bench_op_overhead.cpp
# (tiny tensors: the fixed cost of an op; math/...: the transcendental functions per element at
# 4 K and 1 M, float and bf16) beside benchmarks/peers/torch_op_overhead.py, run one after the
# other on the same CPU. Prints the table with the ratio PyTorch / meshtensor (above 1: meshtensor
# is faster) and writes both sides to OUT (default op_overhead.json).
#
#   scripts/dev/bench_op_overhead.sh [--filter REGEX] [--out OUT] [--python PY] [BUILD_DIR]
#
# BUILD_DIR (default $MESHTENSOR_BUILD_DIR or build/bench) is configured where it is not yet, at the
# build type's optimisation (-O3). PY: a Python with torch (default /usr/bin/python3).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
filter="" out=op_overhead.json python=/usr/bin/python3 build=""
rest=()
while [ $# -gt 0 ]; do
  case $1 in
    --filter) filter=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "bench_op_overhead.sh: unknown argument '$1'" >&2; exit 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
build=${rest[0]:-${MESHTENSOR_BUILD_DIR:-$root/build/bench}}
log() { echo "[bench_op_overhead] $*" >&2; }
bench_build_target "$build" bench_op_overhead -- -DMESHTENSOR_BUILD_TESTS=OFF
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (1-minute above 0.5: not a quiet machine)"
log "CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1); avx512f: $(grep -q -w avx512f /proc/cpuinfo && echo yes || echo no); OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
"$build/benchmarks/bench_op_overhead" ${filter:+--benchmark_filter="$filter"} --benchmark_out="$raw/ours.json" \
  --benchmark_out_format=json >/dev/null
"$python" "$root/benchmarks/peers/torch_op_overhead.py" --ours "$raw/ours.json" --out "$out"
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
