#!/usr/bin/env bash
# The main example: a distributed matrix product on a 2x2 mesh of 4 ranks. Installs what is
# missing and builds first. Arguments pass to the example (e.g. --size 2048).
MESHTENSOR_BUILD_DIR=${MESHTENSOR_BUILD_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/example}
source "$(dirname "$0")/common.sh"
MESHTENSOR_TARGETS=matmul configure_and_build -DMESHTENSOR_BUILD_TESTS=OFF -DMESHTENSOR_BUILD_BENCHMARKS=OFF -DMESHTENSOR_EXAMPLE_OPTIMIZATION=
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} mpiexec -n 4 "$BUILD_DIR/examples/matmul" "$@"
