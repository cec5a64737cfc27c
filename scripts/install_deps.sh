#!/usr/bin/env bash
# Installs everything meshtensor's build, tests and examples need on Debian bookworm.
# Idempotent: does nothing where all is present.
#   Debian packages (with sudo where not root), then Kokkos 3.4.01 built from Debian's
#   trilinos source package into a prefix of its own, unless Kokkos_ROOT is set.
#   --bench also installs the benchmarks' peers and plotting (scripts/bench.sh); the test suite
#   does not need them.
# Prints the Kokkos prefix on the last line of stdout as KOKKOS_ROOT=<dir>.
set -euo pipefail

backends="${MESHTENSOR_KOKKOS_BACKENDS:-serial,openmp}"   # comma list: serial,openmp
bench=0
while [ $# -gt 0 ]; do
  case "$1" in
    --backends) backends="$2"; shift 2 ;;
    --bench) bench=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install_deps.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
log() { echo "[install_deps] $*" >&2; }

packages=(g++ cmake make pkg-config libopenmpi-dev openmpi-bin libboost1.81-dev libopenblas-dev
          dataset-fashion-mnist zlib1g-dev gnuplot-nox libbenchmark-dev libcli11-dev libfmt-dev nlohmann-json3-dev
          python3-torch python3-numpy)   # PyTorch: the transformer_lm cross-check (ctest label crosscheck)
backports_packages=(catch2)
# Optional (--bench): Eigen and ScaLAPACK (C++ peers), matplotlib (plots),
# venv and pip (the JAX and Mesh-TensorFlow venvs of scripts/bench_venv.sh).
bench_packages=(libeigen3-dev libscalapack-openmpi-dev python3-matplotlib python3-venv python3-pip)
if [ "$bench" = 1 ]; then packages+=("${bench_packages[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
catch2_version=$(dpkg-query -W -f='${Version}' catch2 2>/dev/null || true)
need_catch2=0
case "$catch2_version" in 3.*) ;; *) need_catch2=1 ;; esac

# The URI of the machine's own Debian mirror, read from its apt sources (never hard-coded here).
debian_uri() {
  local f uri=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk 'BEGIN{RS=""; FS="\n"}
      { u=""; s=""; for (i=1;i<=NF;i++) { if ($i ~ /^URIs:/) u=$i; if ($i ~ /^Suites:/) s=$i }
        if (s ~ /[ \t]bookworm([ \t]|$)/ && u != "") { sub(/^URIs:[ \t]*/, "", u); split(u, a, " "); print a[1]; exit } }' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  if [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1=="deb" && $3=="bookworm" {print $2; exit}' /etc/apt/sources.list)
  fi
  echo "$uri"
}

extra_sources=/etc/apt/sources.list.d/meshtensor-extra.sources
need_sources=0
kokkos_needed=0
if [ -z "${Kokkos_ROOT:-}" ]; then kokkos_needed=1; fi

deps_root="${MESHTENSOR_DEPS_PREFIX:-}"
if [ -z "$deps_root" ]; then
  if [ "$(id -u)" = 0 ]; then deps_root=/opt/meshtensor-deps; else deps_root="$HOME/.local/meshtensor-deps"; fi
fi
kokkos_prefix="$deps_root/kokkos-3.4.01-$(echo "$backends" | tr ',' '-')"
for d in lib lib64; do
  if [ -f "$kokkos_prefix/$d/cmake/Kokkos/KokkosConfig.cmake" ]; then kokkos_needed=0; fi
done

if [ "$need_catch2" = 1 ] || [ "$kokkos_needed" = 1 ]; then need_sources=1; fi
if [ "$need_sources" = 1 ] && [ ! -f "$extra_sources" ]; then
  uri=$(debian_uri)
  if [ -z "$uri" ]; then
    echo "install_deps.sh: no Debian bookworm entry found in /etc/apt/sources.list{,.d}; add one or install catch2 3.x and set Kokkos_ROOT" >&2
    exit 1
  fi
  log "adding bookworm-backports and deb-src entries for $uri"
  $SUDO tee "$extra_sources" >/dev/null <<SRC
Types: deb deb-src
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: $uri
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  missing+=(__update__)
fi

if [ ${#missing[@]} -gt 0 ] || [ "$need_catch2" = 1 ]; then
  log "apt-get update"
  $SUDO apt-get update -qq
  real_missing=()
  for p in "${missing[@]}"; do [ "$p" = __update__ ] || real_missing+=("$p"); done
  if [ ${#real_missing[@]} -gt 0 ]; then
    log "installing ${real_missing[*]}"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${real_missing[@]}" >&2
  fi
  if [ "$need_catch2" = 1 ]; then
    log "installing catch2 3.x from bookworm-backports"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports "${backports_packages[@]}" >&2
  fi
fi

if [ "$kokkos_needed" = 1 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  log "fetching Debian's trilinos source package (Kokkos 3.4.01 lives in packages/kokkos)"
  (cd "$work" && apt-get source --download-only trilinos >&2)
  orig=$(ls "$work"/trilinos_*.orig.tar.* | head -n1)
  log "extracting packages/kokkos from $(basename "$orig")"
  tar -xf "$orig" -C "$work" --wildcards '*/packages/kokkos/*'
  src=$(dirname "$(find "$work" -maxdepth 4 -type d -path '*/packages/kokkos' | head -n1)")/kokkos
  cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=20 -DCMAKE_INSTALL_PREFIX="$kokkos_prefix"
               -DKokkos_ENABLE_SERIAL=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON)
  case ",$backends," in *,openmp,*) cmake_flags+=(-DKokkos_ENABLE_OPENMP=ON) ;; esac
  log "building Kokkos ($backends) into $kokkos_prefix"
  build_log="$work/kokkos-build.log"
  if ! { cmake -S "$src" -B "$work/build" "${cmake_flags[@]}" &&
         cmake --build "$work/build" -j "$(nproc)" &&
         $SUDO cmake --install "$work/build"; } >"$build_log" 2>&1; then
    tail -n 40 "$build_log" >&2
    echo "install_deps.sh: building Kokkos from $src failed (log above)" >&2
    exit 1
  fi
fi

if [ -n "${Kokkos_ROOT:-}" ]; then echo "KOKKOS_ROOT=$Kokkos_ROOT"; else echo "KOKKOS_ROOT=$kokkos_prefix"; fi
