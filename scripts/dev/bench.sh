#!/usr/bin/env bash
# Builds and runs every benchmark comparison (docs/performance.md), prints the table, writes
# benchmarks/results/<date>.json and the plots docs/bench_*.png.
#
#   OPENBLAS_CORETYPE=SkylakeX scripts/dev/bench.sh [--rounds N] [--quick] [--no-peers] [--no-compile]
#
#   --rounds N    rounds of every benchmark (default 5); each number is the median over the rounds,
#                 with min and max. One round runs each binary once, ours and the peer interleaved
#                 (registered next to each other), each after an untimed warm-up.
#   --quick       tiny sizes, one iteration, one round (checks the pipeline, no real numbers)
#   --no-peers    skip the Python peers (PyTorch, JAX, Mesh-TensorFlow)
#   --no-compile  skip the compile-time comparison
#
# Environment: OPENBLAS_CORETYPE is read, never set (unset, Debian's OpenBLAS may fall back to a
# slow kernel on CPUs it does not know; the results record what it was). Threads per process:
# MESHTENSOR_BENCH_THREADS (default 1), given to OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, PyTorch and
# (one thread per device) XLA and TensorFlow. MPI runs use 2 and 4 ranks; the machine's core count
# decides whether 4 ranks oversubscribe.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rounds=5 quick=0 peers=1 compile=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --quick) quick=1; rounds=1; shift ;;
    --no-peers) peers=0; shift ;;
    --no-compile) compile=0; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
command_line="scripts/dev/bench.sh $*"
log() { echo "[bench] $*" >&2; }

kokkos=$(bash "$root/scripts/install_deps.sh" --bench | sed -n 's/^KOKKOS_ROOT=//p' | tail -n 1)
build=${MESHTENSOR_BUILD_DIR:-$root/build/bench}
log "configuring and building in $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMESHTENSOR_EXAMPLE_OPTIMIZATION= -DKokkos_ROOT="$kokkos" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target bench_local bench_dist bench_comm >&2
venv="" venv_mtf=""
if [ "$peers" = 1 ]; then
  mapfile -t venvs < <(bash "$root/scripts/dev/bench_venv.sh")
  venv=${venvs[0]} venv_mtf=${venvs[1]}
fi

threads=${MESHTENSOR_BENCH_THREADS:-1}
export MESHTENSOR_BENCH_THREADS=$threads OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads
export OMP_PROC_BIND=false OMPI_MCA_rmaps_base_oversubscribe=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
if [ "$quick" = 1 ]; then export MESHTENSOR_BENCH_SMOKE=1 MESHTENSOR_BENCH_ITERS=1; fi
log "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)} threads per process=$threads rounds=$rounds"
[ -n "${OPENBLAS_CORETYPE:-}" ] || log "OPENBLAS_CORETYPE is unset: Debian's OpenBLAS may use a slow generic kernel here"

raw="$build/bench-raw-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$raw" "$root/benchmarks/results"
bin="$build/benchmarks"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

py_sizes=() mtf_sizes=()
if [ "$quick" = 1 ]; then
  py_sizes=(--sizes 16 --iters 1) mtf_sizes=(--sizes 64 --mlp 16,16,32,16 --iters 1)
fi

compile_times() {  # round index: times the compile of each TU, from compile_commands.json
  local out="$raw/round$1-compile.json"
  : >"$out"
  python3 - "$build/compile_commands.json" "$root" "$out" <<'PY'
import json, shlex, subprocess, sys, time
db, root, out = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
want = {"examples/matmul/main.cpp": "compile_example_matmul/ours/0",
        "benchmarks/compile/ops50_meshtensor.cpp": "compile_ops50/ours/0",
        "benchmarks/compile/ops50_plain.cpp": "compile_ops50/plain/0"}
with open(out, "a") as f:
    for rel, name in want.items():
        e = next((e for e in db if e["file"].endswith(rel)), None)
        if e is None:
            continue
        cmd = shlex.split(e["command"])
        if "-o" in cmd:
            cmd[cmd.index("-o") + 1] = "/dev/null"
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=e["directory"], check=True)
        f.write(json.dumps({"name": name, "seconds": time.perf_counter() - t0}) + "\n")
PY
}

for r in $(seq 1 "$rounds"); do
  log "round $r/$rounds: local einsum"
  "$bin/bench_local" --benchmark_out="$raw/round$r-local.json" --benchmark_out_format=json >/dev/null
  if [ "$peers" = 1 ]; then
    log "round $r/$rounds: PyTorch einsum"
    /usr/bin/python3 "$root/benchmarks/peers/torch_einsum.py" "${py_sizes[@]}" >"$raw/round$r-torch.json"
  fi
  for np in 2 4; do
    log "round $r/$rounds: distributed products and communication on $np ranks"
    mpiexec -n "$np" "$bin/bench_dist" --benchmark_out="$raw/round$r-dist-np$np.json" --benchmark_out_format=json >/dev/null
    mpiexec -n "$np" "$bin/bench_comm" --benchmark_out="$raw/round$r-comm-np$np.json" --benchmark_out_format=json >/dev/null
  done
  if [ "$peers" = 1 ]; then
    log "round $r/$rounds: JAX"
    "$venv/bin/python" "$root/benchmarks/peers/jax_mesh.py" "${mtf_sizes[@]}" >"$raw/round$r-jax.json" 2>"$raw/round$r-jax.log" ||
      log "JAX failed (see $raw/round$r-jax.log)"
    log "round $r/$rounds: Mesh-TensorFlow"
    "$venv_mtf/bin/python" "$root/benchmarks/peers/mtf_mesh.py" "${mtf_sizes[@]}" >"$raw/round$r-mtf.json" 2>"$raw/round$r-mtf.log" ||
      log "Mesh-TensorFlow failed (see $raw/round$r-mtf.log)"
  fi
  if [ "$compile" = 1 ]; then
    log "round $r/$rounds: compile times"
    compile_times "$r"
  fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

stamp=$(date +%Y-%m-%d)
out="$root/benchmarks/results/$stamp.json"
[ "$quick" = 1 ] && out="$root/benchmarks/results/$stamp-quick.json.tmp"
export MESHTENSOR_BENCH_LOAD_BEFORE="$load_before" MESHTENSOR_BENCH_LOAD_AFTER="$load_after"
export MESHTENSOR_BENCH_COMMAND="OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} $command_line"
export MESHTENSOR_BENCH_MACHINE="$(nproc --all) cores, $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n1), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
plots="$root/docs"
[ "$quick" = 1 ] && plots="$raw"
/usr/bin/python3 "$root/benchmarks/report.py" "$raw" "$out" "$plots"
log "load average before: $load_before, after: $load_after"
log "wrote $out (raw results in $raw)"
