#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer on a chosen set of test programs, each run at 1, 2
# and 4 ranks (issue 33, "sanitizers as a habit"). Builds its own tree (build/sanitize, or
# $MESHTENSOR_BUILD_DIR) at -O1 -g with -fsanitize=address,undefined, the library's code and the
# tests instrumented (Kokkos, Open MPI, OpenBLAS and oneDNN are Debian's, not instrumented).
#
#   scripts/dev/sanitize.sh [TARGET ...]       (default: the set below)
#
# Leaks that Open MPI, hwloc, PMIx and libevent keep until exit are suppressed (LSan's
# suppressions, written to the build tree); everything else reported fails the run. Each run's
# sanitizer output goes to BUILD_DIR/sanitize-logs/<target>.np<N>.log; the summary names the
# runs that reported something, with the first line of each report.
set -euo pipefail
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(unit_tests mpi_reductions_test mpi_reshape_test mpi_conv_direct_equivalence_test
                                     mpi_cross_entropy_equivalence_test mpi_nn_gradient_test checkpoint_test)
export MESHTENSOR_BUILD_DIR=${MESHTENSOR_BUILD_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/sanitize}
# shellcheck source-path=SCRIPTDIR source=../common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
log() { echo "[sanitize] $*" >&2; }

flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
log "configuring $BUILD_DIR (-O1 -g $flags)"
cmake -S "$MESHTENSOR_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKokkos_ROOT="$KOKKOS_ROOT" \
      -DMESHTENSOR_CHECKPOINT_PYTHON="$CHECKPOINT_PYTHON" -DMESHTENSOR_TEST_OPTIMIZATION=-O1 \
      -DMESHTENSOR_EXAMPLE_OPTIMIZATION=-O1 -DMESHTENSOR_CUDA_KOKKOS_ROOT= \
      "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined" >/dev/null
start=$(date +%s)
log "building ${targets[*]}"
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" >&2
built=$(date +%s)

supp="$BUILD_DIR/lsan-openmpi.supp"
cat >"$supp" <<'SUPP'
leak:libmpi.so
leak:libopen-pal.so
leak:libopen-rte.so
leak:libhwloc.so
leak:libpmix.so
leak:libevent
leak:mca_
leak:libgomp.so
SUPP
# Open MPI's components are plugins it dlcloses at MPI_Finalize: their leaks would then show as
# "<unknown module>", which no suppression can name. Kept loaded, they are named; and malloc's
# callers are unwound from DWARF, not frame pointers (Debian's libraries keep none), or the stacks
# end in garbage frames.
export OMPI_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=0:halt_on_error=1
export LSAN_OPTIONS=suppressions=$supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
logs="$BUILD_DIR/sanitize-logs"
mkdir -p "$logs"
failed=()
for t in "${targets[@]}"; do
  exe=$(find "$BUILD_DIR" -type f -name "$t" -perm -u+x | head -n 1)
  [ -n "$exe" ] || { log "no program '$t' in $BUILD_DIR"; exit 2; }
  for n in 1 2 4; do
    [ "$t" = unit_tests ] && [ "$n" != 1 ] && continue  # single-process tests
    out="$logs/$t.np$n.log"
    if timeout 900 mpiexec -n "$n" "$exe" >"$out" 2>&1 && ! grep -q -E "ERROR: (Address|Leak)Sanitizer|runtime error:" "$out"; then
      log "$t at $n rank(s): clean"
    else
      first=$(grep -m 1 -E "ERROR: (Address|Leak)Sanitizer|runtime error:|FAILED" "$out" || tail -n 1 "$out")
      log "$t at $n rank(s): REPORTED: $first (log: $out)"
      failed+=("$t.np$n")
    fi
  done
done
log "build $((built - start)) s, runs $(($(date +%s) - built)) s"
if [ ${#failed[@]} -gt 0 ]; then
  log "runs with reports: ${failed[*]}"
  exit 1
fi
log "every run clean"
