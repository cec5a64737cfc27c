#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs every test (ctest arguments pass
# through, e.g. `scripts/test.sh -L mpi`).
source "$(dirname "$0")/common.sh"
configure_and_build
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" "$@"
