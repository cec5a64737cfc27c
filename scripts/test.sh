#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test (ctest arguments pass
# through, e.g. `scripts/test.sh -L mpi`).
# Where nvcc is (in PATH or /usr/local/cuda/bin), a CUDA Kokkos is installed too (once, about 3
# minutes, into a prefix of its own, whatever Kokkos_ROOT says) and the cuda_build test compiles a
# representative set for the GPU with it. MESHTENSOR_CUDA_KOKKOS_ROOT names a CUDA Kokkos of your
# own instead; MESHTENSOR_CUDA_BUILD=0 skips the CUDA build.
# At the end it prints the time of each phase, by label and the slowest tests, against the suite's
# budget (scripts/suite_times.py, scripts/suite_budget.json).
suite_start=$SECONDS
source "$(dirname "$0")/common.sh"
cuda_kokkos="${MESHTENSOR_CUDA_KOKKOS_ROOT:-}"
if [ "${MESHTENSOR_CUDA_BUILD:-auto}" = 0 ]; then
  cuda_kokkos=""
elif [ -z "$cuda_kokkos" ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  cuda_kokkos=$(env -u Kokkos_ROOT bash "$MESHTENSOR_ROOT/scripts/install_deps.sh" --backends serial,openmp,cuda |
                sed -n 's/^KOKKOS_ROOT=//p' | tail -n 1)
fi
# A CUDA Kokkos's nvcc_wrapper calls the nvcc in PATH.
if [ -n "$cuda_kokkos" ] && ! command -v nvcc >/dev/null; then export PATH="/usr/local/cuda/bin:$PATH"; fi
install_seconds=$((SECONDS - suite_start))
# The examples, the LM tool and the benchmarks are built here to be tested, at -Og (CMakeLists.txt,
# MESHTENSOR_EXAMPLE_OPTIMIZATION); run_example.sh and the benchmark scripts build them at -O3.
build_start=$SECONDS
configure_and_build -DMESHTENSOR_CUDA_KOKKOS_ROOT="$cuda_kokkos" -DMESHTENSOR_EXAMPLE_OPTIMIZATION=-Og
build_seconds=$((SECONDS - build_start))
tests_start=$SECONDS
rc=0
# Three test slots per core: much of the tests' time is waiting (MPI's start-up, watchdog and failure
# timeouts, the fault tests' kills and restarts, Slurm's daemons, sleeps of processes meant to be
# slow), and a test asks for a slot per rank, so with fewer slots a 4-rank test ran alone. Measured
# on 2 cores: the whole phase 965 s with -j 2, 743 s with -j 4; the mpi label (406 tests) 425 s with
# -j 4, 356 s with -j 6, 363 s with -j 8. Tests that time themselves run alone (RUN_SERIAL);
# MESHTENSOR_TEST_JOBS overrides.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${MESHTENSOR_TEST_JOBS:-$((JOBS * 3))}" "$@" || rc=$?
whole=()
if [ $# -eq 0 ]; then whole=(--whole); fi
python3 "$MESHTENSOR_ROOT/scripts/suite_times.py" --build-dir "$BUILD_DIR" --install "$install_seconds" \
  --build "$build_seconds" --tests "$((SECONDS - tests_start))" "${whole[@]}" || true
exit "$rc"
