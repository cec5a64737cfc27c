#!/usr/bin/env bash
# Prepares, on a machine with Debian's package registry, the folder that scripts/gpu_check.sh needs
# on a GPU machine that has the CUDA toolkit, CMake and g++ but reaches no registry: Debian's .debs
# of what meshtensor builds against (OpenMPI, OpenBLAS, Boost's headers, Catch2, CLI11,
# nlohmann-json, Google Benchmark, zlib's headers) and the CUDA Kokkos that scripts/install_deps.sh
# builds (MESHTENSOR_CUDA_ARCH, default HOPPER90). About 40 MiB; nothing is installed here but that
# Kokkos.
#
#   scripts/gpu_prepare.sh [DIR]      # default DIR: .gpu in the repository (ignored by git)
#
# Then, on the GPU machine, from the repository root with DIR beside it: scripts/gpu_check.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/.gpu}
log() { echo "[gpu_prepare] $*" >&2; }

# Build-time packages and, for OpenMPI and OpenBLAS, the run-time libraries they load (the GPU
# machine's own system need not have them). Versions are bookworm's, as the suite is tested with.
packages=(libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7
          libevent-pthreads-2.1-7 libevent-2.1-7 libfabric1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
          libpsm-infinipath1 libpsm2-2 libucx0 libnuma1 libgfortran5 libltdl7 libudev1
          libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libboost1.81-dev libcatch2-dev libcli11-dev
          nlohmann-json3-dev libbenchmark-dev libbenchmark1debian zlib1g-dev zlib1g)

kokkos=$(env -u Kokkos_ROOT bash "$root/scripts/install_deps.sh" --backends serial,openmp,cuda |
         sed -n 's/^KOKKOS_ROOT=//p' | tail -n 1)
[ -n "$kokkos" ] && [ -x "$kokkos/bin/nvcc_wrapper" ] || { echo "gpu_prepare.sh: no CUDA Kokkos from install_deps.sh" >&2; exit 1; }

rm -rf "$dir"
mkdir -p "$dir/debs"
log "downloading ${#packages[@]} Debian packages into $dir/debs"
(cd "$dir/debs" && apt-get download "${packages[@]}" >/dev/null)
log "copying the CUDA Kokkos ($kokkos)"
mkdir -p "$dir/kokkos"
cp -a "$kokkos" "$dir/kokkos/"
echo "$kokkos" >"$dir/kokkos/PREFIX"   # gpu_check.sh puts it back at the same path (its CMake files name it)
# .gitignore keeps .gpu/ out of git; the device tool carries it when named (carry: [".gpu"]).
log "done: $(du -sh "$dir" | cut -f1) in $dir"
