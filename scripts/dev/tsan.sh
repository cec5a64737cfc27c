#!/usr/bin/env bash
# ThreadSanitizer on the OpenMP backend's kernels with more than one thread (issue 33, item 5).
# Builds its own tree (build/tsan, or $MESHTENSOR_BUILD_DIR) and runs a chosen set of test
# programs at 1 rank with OMP_NUM_THREADS=2 and 4, each with the default row walk and the team walk.
#
#   scripts/dev/tsan.sh [TARGET ...]      (default: the set below; about 15 min on 2 cores, once built)
#
# Why not Debian's libgomp: it is not built with TSan, so TSan cannot see its barriers and reports
# every kernel that follows another as a race. LLVM's libomp (Debian's libomp-14-dev) carries
# Archer (libarcher.so), an OMPT tool that tells TSan about OpenMP's synchronisation. So:
#   - Kokkos (3.4.01, from Debian's trilinos source as install_deps.sh builds it) and the tests are
#     compiled by g++ with -fsanitize=thread -fopenmp, and linked with -L/usr/lib/llvm-14/lib, where
#     libgomp.so is LLVM's link to libomp.so.5: g++'s GOMP_* calls go to libomp, which implements
#     that ABI. oneDNN is left out (MESHTENSOR_DNNL=OFF): it is built against libgomp.
#   - OMP_TOOL_LIBRARIES loads Archer; the TSan suppression called_from_lib:libomp.so.5 ignores
#     what libomp itself does through intercepted calls (it initialises a worker's mutex on the
#     worker and locks it on the master, ordered by its own atomics, which TSan cannot see). Code
#     compiled here is still checked on every stack, libomp's frames included.
# A probe checks the set-up first: a kernel with a planted race must be reported, clean kernels
# must not. Open MPI, OpenBLAS and libomp are Debian's, not instrumented (OPENBLAS_NUM_THREADS=1).
# Logs: BUILD_DIR/tsan-logs/<target>.t<threads>.<walk>.log; the summary names every run that
# reported something.
set -euo pipefail
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(mpi_nn_gradient_test mpi_reductions_test mpi_reshape_test mpi_elementwise_test mpi_einsum_test
                                     mpi_cross_entropy_equivalence_test mpi_conv_direct_equivalence_test)
export MESHTENSOR_BUILD_DIR=${MESHTENSOR_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/tsan}
# shellcheck source-path=SCRIPTDIR source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
log() { echo "[tsan] $*" >&2; }

llvm=/usr/lib/llvm-14/lib
archer=$llvm/libarcher.so
for f in "$archer" "$llvm/libomp.so.5" "$llvm/libgomp.so"; do
  [ -e "$f" ] || { log "no $f: apt-get install libomp-14-dev (LLVM's OpenMP runtime and Archer)"; exit 2; }
done
flags="-fsanitize=thread -fno-omit-frame-pointer"
link_flags="-fsanitize=thread -L$llvm -Wl,-rpath,$llvm"

# Kokkos with TSan, once: its OpenMP backend's own code (pools, team rendezvous) is checked too.
kokkos=$BUILD_DIR/kokkos
if [ ! -f "$kokkos/lib/cmake/Kokkos/KokkosConfig.cmake" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  log "fetching Debian's trilinos source (166 MB) for Kokkos 3.4.01, to build it with -fsanitize=thread"
  (cd "$work" && apt-get source --download-only trilinos >"$work/fetch.log" 2>&1) || { cat "$work/fetch.log" >&2; exit 2; }
  tar -xf "$(find "$work" -maxdepth 1 -name 'trilinos_*.orig.tar.*' | head -n 1)" -C "$work" --wildcards '*/packages/kokkos/*'
  src=$(find "$work" -maxdepth 4 -type d -path '*/packages/kokkos' | head -n 1)
  log "building Kokkos (Serial, OpenMP) into $kokkos (about 1 min)"
  # shellcheck disable=SC2015  # any failing step lands in the log's tail
  cmake -S "$src" -B "$work/build" -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" "-DCMAKE_CXX_FLAGS=$flags" -DCMAKE_CXX_STANDARD=20 \
        -DCMAKE_INSTALL_PREFIX="$kokkos" -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_OPENMP=ON \
        -DCMAKE_POSITION_INDEPENDENT_CODE=ON >"$work/kokkos.log" 2>&1 &&
    cmake --build "$work/build" -j "$JOBS" >>"$work/kokkos.log" 2>&1 &&
    cmake --install "$work/build" >>"$work/kokkos.log" 2>&1 || { tail -n 30 "$work/kokkos.log" >&2; exit 2; }
fi

export OMP_TOOL_LIBRARIES=$archer OMP_PROC_BIND=false OPENBLAS_NUM_THREADS=1
supp=$BUILD_DIR/tsan-libomp.supp
echo "called_from_lib:libomp.so.5" >"$supp"
export TSAN_OPTIONS="suppressions=$supp:halt_on_error=0"

# The probe: Archer loaded and TSan seeing the kernels, before anything is believed.
probe=$BUILD_DIR/tsan-probe
cat >"$probe.cpp" <<'CPP'
#include <Kokkos_Core.hpp>
#include <cstdlib>
int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  {
    Kokkos::View<double*> a("a", 1 << 14);
    Kokkos::View<double> racy("racy");
    Kokkos::parallel_for(a.extent(0), KOKKOS_LAMBDA(int i) { a(i) = i; });
    double s = 0;
    Kokkos::parallel_reduce(a.extent(0), KOKKOS_LAMBDA(int i, double& x) { x += a(a.extent(0) - 1 - i); }, s);
    if (std::getenv("PLANT_RACE")) Kokkos::parallel_for(a.extent(0), KOKKOS_LAMBDA(int i) { racy() += a(i); });
  }
  Kokkos::finalize();
}
CPP
# shellcheck disable=SC2086  # the flags are words
g++ -std=c++20 -w -g -O1 -fopenmp $flags -isystem "$kokkos/include" "$probe.cpp" -o "$probe" $link_flags \
    "$kokkos/lib/libkokkoscore.a" -ldl
if ! ldd "$probe" | grep -q 'libomp\.so\.5' || ldd "$probe" | grep -q 'libgomp'; then
  log "the probe is not linked to LLVM's libomp alone:"; ldd "$probe" >&2; exit 2
fi
if ! OMP_NUM_THREADS=4 "$probe" >"$probe.clean.log" 2>&1; then
  log "the probe's clean kernels were reported (is Archer loaded?): $probe.clean.log"; exit 2
fi
if PLANT_RACE=1 OMP_NUM_THREADS=4 "$probe" >"$probe.race.log" 2>&1 || ! grep -q "data race" "$probe.race.log"; then
  log "the probe's planted race was not reported: $probe.race.log"; exit 2
fi
log "probe: clean kernels silent, the planted race reported (Archer and TSan in place)"

log "configuring $BUILD_DIR (-O1 -g $flags, libomp, no oneDNN)"
cmake -S "$MESHTENSOR_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKokkos_ROOT="$kokkos" \
      -DMESHTENSOR_DNNL=OFF -DMESHTENSOR_BUILD_EXAMPLES=OFF -DMESHTENSOR_BUILD_TOOLS=OFF -DMESHTENSOR_BUILD_BENCHMARKS=OFF \
      -DMESHTENSOR_TEST_OPTIMIZATION=-O1 -DMESHTENSOR_CUDA_KOKKOS_ROOT= -DMESHTENSOR_CHECKPOINT_PYTHON= \
      "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$link_flags" >/dev/null
log "building ${targets[*]}"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" >&2

logs=$BUILD_DIR/tsan-logs
mkdir -p "$logs"
failed=()
for t in "${targets[@]}"; do
  exe=$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x | head -n 1)
  [ -n "$exe" ] || { log "no program '$t' in $BUILD_DIR"; exit 2; }
  for threads in 2 4; do
    for walk in default team; do
      out=$logs/$t.t$threads.$walk.log
      rc=0
      row_walk=()
      [ "$walk" = default ] || row_walk=(MESHTENSOR_ROW_WALK=team)
      env OMP_NUM_THREADS=$threads "${row_walk[@]}" mpiexec -n 1 "$exe" >"$out" 2>&1 || rc=$?
      reports=$(grep -c "WARNING: ThreadSanitizer" "$out" || true)
      log "$t, $threads threads, $walk row walk: exit $rc, $reports report(s)"
      if [ "$rc" != 0 ] || [ "$reports" != 0 ]; then
        failed+=("$t.t$threads.$walk: $(grep -m1 'SUMMARY: ThreadSanitizer' "$out" || tail -n 1 "$out")")
      fi
    done
  done
done
if [ ${#failed[@]} -gt 0 ]; then
  log "reported or failed:"
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
log "every run clean (logs: $logs)"
