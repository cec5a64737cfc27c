# shellcheck shell=bash
# Shared by the scripts: installs what is missing, configures and builds.
# Sourced, not run. Sets MESHTENSOR_ROOT, KOKKOS_ROOT, CHECKPOINT_PYTHON and BUILD_DIR.
set -euo pipefail
MESHTENSOR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps_out=$(bash "$MESHTENSOR_ROOT/scripts/install_deps.sh")
KOKKOS_ROOT=$(echo "$deps_out" | sed -n 's/^KOKKOS_ROOT=//p' | tail -n 1)
CHECKPOINT_PYTHON=$(echo "$deps_out" | sed -n 's/^CHECKPOINT_PYTHON=//p' | tail -n 1)
BUILD_DIR=${MESHTENSOR_BUILD_DIR:-$MESHTENSOR_ROOT/build/release}
JOBS=${MESHTENSOR_JOBS:-$(nproc)}

# OpenMPI refuses root and more ranks than cores unless told; harmless for other MPIs.
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_PROC_BIND=${OMP_PROC_BIND:-false}

configure_and_build() {
  cmake -S "$MESHTENSOR_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$KOKKOS_ROOT" \
        -DMESHTENSOR_CHECKPOINT_PYTHON="$CHECKPOINT_PYTHON" "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS" ${MESHTENSOR_TARGETS:+--target $MESHTENSOR_TARGETS}
}
