#!/usr/bin/env bash
# The safetensors reader under libFuzzer (issue 33, "bad checkpoints from elsewhere"): builds
# tests/fuzz/safetensors_header_fuzz.cpp with clang++ -fsanitize=fuzzer,address,undefined and runs
# it from the seed corpus. The ctest `fuzz` label runs it for 10 s; this is the long run by hand.
#
#   scripts/dev/fuzz.sh [SECONDS] [libFuzzer flags ...]     (default 3600: an hour)
#
# Runs at nice 19 (it shares the cores with builds). New inputs go to build/fuzz/corpus (kept
# across runs: a second run starts where the first stopped), crashes to build/fuzz/crash-*, the
# log to build/fuzz/fuzz.log. MESHTENSOR_FUZZ_MPIIO=1 also sends each input through io::inspect
# (MPI-IO on one rank; far fewer inputs a second). Needs clang and libFuzzer (Debian: clang-14,
# libclang-rt-14-dev), Open MPI and nlohmann-json; Kokkos's headers only (KOKKOS_ROOT, or
# /opt/meshtensor-deps or ~/.local/meshtensor-deps as scripts/install_deps.sh installs it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=${1:-3600}
shift || true
out=${MESHTENSOR_BUILD_DIR:-$root/build/fuzz}
cxx=${FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}
[ -n "$cxx" ] || { echo "fuzz.sh: no clang++ (Debian: apt-get install clang-14 libclang-rt-14-dev)" >&2; exit 2; }
kokkos=${KOKKOS_ROOT:-}
for k in /opt/meshtensor-deps/kokkos-3.4.01-serial-openmp "$HOME/.local/meshtensor-deps/kokkos-3.4.01-serial-openmp"; do
  [ -n "$kokkos" ] || { [ -f "$k/include/Kokkos_Core.hpp" ] && kokkos=$k; } || true
done
[ -n "$kokkos" ] || { echo "fuzz.sh: no Kokkos (run scripts/install_deps.sh, or set KOKKOS_ROOT)" >&2; exit 2; }
mkdir -p "$out/corpus"
exe=$out/safetensors_header_fuzz
src=$root/tests/fuzz/safetensors_header_fuzz.cpp
# Kokkos's config asks for OpenMP (-fopenmp: clang's omp.h); nothing of Kokkos is linked.
# shellcheck disable=SC2046
nice -n 19 "$cxx" -std=c++20 -g -O1 -fopenmp -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -isystem "$kokkos/include" $(mpicxx --showme:compile) "$src" -o "$exe" \
  $(mpicxx --showme:link)
echo "fuzz.sh: built $exe; fuzzing for $seconds s (log: $out/fuzz.log)" >&2
cd "$out"
if [ "${MESHTENSOR_FUZZ_MPIIO:-}" = 1 ]; then
  # Open MPI's own allocations, kept until exit, suppressed by library as scripts/dev/sanitize.sh does
  # (its plugins kept loaded so that they are named; malloc's callers unwound from DWARF).
  printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so libhwloc.so libpmix.so libevent mca_ >"$out/lsan-openmpi.supp"
  export OMPI_MCA_mca_base_component_disable_dlclose=1 ASAN_OPTIONS=fast_unwind_on_malloc=0
  export LSAN_OPTIONS=suppressions=$out/lsan-openmpi.supp:print_suppressions=0
  [ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
set +e
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 nice -n 19 "$exe" -max_total_time="$seconds" -timeout=10 \
  -dict="$root/tests/fuzz/safetensors.dict" -artifact_prefix="$out/" -print_final_stats=1 "$@" \
  "$out/corpus" "$root/tests/fuzz/corpus" >"$out/fuzz.log" 2>&1
rc=$?
set -e
tail -n 25 "$out/fuzz.log" >&2
exit $rc
