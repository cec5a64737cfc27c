# shellcheck shell=bash
# Shared by the bench_*.sh scripts that build in a tree of their own; sourced, not run. Unlike
# common.sh, sourcing it installs, configures and exports nothing.

# bench_args SCRIPT HELP_LINES OPTION... -- ARG...: reads the script's arguments ARG... as the
# OPTIONs say: `--name:var` sets var to the argument after --name, `--name:var=value` sets var to
# value. -h or --help prints lines HELP_LINES (sed's "2,20") of SCRIPT and exits 0; any other
# argument exits 2 with "SCRIPT's name: unknown argument '...'".
bench_args() {
  local script=$1 help=$2 options=() s found
  shift 2
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  while [ $# -gt 0 ]; do
    case $1 in -h | --help) sed -n "${help}p" "$script"; exit 0 ;; esac
    found=""
    for s in "${options[@]}"; do
      [ "${s%%:*}" = "$1" ] || continue
      found=1 s=${s#*:}
      if [[ $s == *=* ]]; then
        printf -v "${s%%=*}" %s "${s#*=}"
        shift
      else
        printf -v "$s" %s "$2"
        shift 2
      fi
      break
    done
    [ -n "$found" ] || { echo "$(basename "$script"): unknown argument '$1'" >&2; exit 2; }
  done
}

# bench_build_target DIR TARGET... [-- CMAKE_OPTION...]: configures the build tree DIR where it is
# not yet (Release, the examples at the build type's optimization, the CMAKE_OPTIONs, and Kokkos:
# bench_kokkos where the caller has set it, else scripts/install_deps.sh's), then builds the
# TARGETs there with MESHTENSOR_BUILD_JOBS jobs (default nproc); the build's output on stderr.
bench_build_target() {
  local build=$1 root kokkos targets=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do targets+=("$1"); shift; done
  [ $# -eq 0 ] || shift
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  if [ ! -f "$build/CMakeCache.txt" ]; then
    kokkos=${bench_kokkos-$(bash "$root/scripts/install_deps.sh" | sed -n 's/^KOKKOS_ROOT=//p' | tail -n 1)}
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMESHTENSOR_EXAMPLE_OPTIMIZATION= -DKokkos_ROOT="$kokkos" \
          "$@" >/dev/null
  fi
  cmake --build "$build" -j "${MESHTENSOR_BUILD_JOBS:-$(nproc)}" --target "${targets[@]}" >&2
}

# bench_side_by_side NAME DIR OURS PEER WHY: builds meshtensor's program OURS and the peer PEER in
# DIR (exits 1 where PEER was not configured there, saying WHY: the package that brings it), sets
# the environment of a timed MPI run (root allowed, more ranks than cores, one thread per rank) and
# logs the CPU and the load average on stderr as "[NAME] ...".
bench_side_by_side() {
  local name=$1 build=$2 ours=$3 peer=$4 why=$5
  bench_build_target "$build" "$ours" -- -DMESHTENSOR_BUILD_TESTS=OFF
  cmake --build "$build" --target "$peer" >&2 2>/dev/null ||
    { echo "[$name] no $peer in $build ($why not found when it was configured: install it, then reconfigure)" >&2; exit 1; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMP_NUM_THREADS=1 OMP_PROC_BIND=false
  echo "[$name] CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
}

# median: the median of the numbers on stdin, one per line; fails on none (a run that printed no
# figure is an error, not an empty cell).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
