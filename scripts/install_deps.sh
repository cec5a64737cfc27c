#!/usr/bin/env bash
# Installs everything meshtensor's build, tests and examples need on Debian bookworm.
# Idempotent: does nothing, silently, where all is present.
#   Debian packages (with sudo where not root), then Kokkos 3.4.01 built from Debian's
#   trilinos source package into a prefix of its own, unless Kokkos_ROOT is set. The prefix is
#   MESHTENSOR_DEPS_PREFIX, else /opt/meshtensor-deps for root, ~/.local/meshtensor-deps for others;
#   a prefix the user can write to is built and installed as the user, never with sudo.
#   --backends LIST (or MESHTENSOR_KOKKOS_BACKENDS): Kokkos's backends, a comma list of serial,
#   openmp and cuda (default serial,openmp). cuda needs nvcc (the CUDA toolkit, in PATH or
#   /usr/local/cuda/bin); Kokkos 3.4.01 is then patched for CUDA 13 and C++20
#   (scripts/kokkos-3.4.01-cuda13.patch) and built for MESHTENSOR_CUDA_ARCH (Kokkos's name of
#   the GPU architecture, default HOPPER90; e.g. AMPERE80), into a prefix of its own.
#   --bench also installs the benchmarks' peers and plotting (scripts/dev/bench.sh); the test suite
#   does not need them.
# Prints one line per step on stderr; apt's, dpkg's and the Kokkos build's output go to a log
# (${XDG_CACHE_HOME:-~/.cache}/meshtensor/install_deps.log), whose tail is shown on failure.
# Prints CHECKPOINT_PYTHON=<python with safetensors, and sacrebleu where PyPI gave it> and, on the
# last line of stdout, the Kokkos prefix as KOKKOS_ROOT=<dir>.
# Sourcing this file only defines its functions (tests/scripts/debian_uri_test.sh uses debian_uri).

log() { echo "[install_deps] $*" >&2; }

# The documentation site's generators (scripts/docs.sh, which installs only these where missing):
# Doxygen reads the headers, Sphinx with Breathe and MyST renders the site.
DOCS_PACKAGES=(doxygen python3-sphinx python3-breathe python3-myst-parser python3-sphinx-rtd-theme)
die() { echo "install_deps.sh: $*" >&2; exit 1; }

# debian_uri [FILE...]: the URI of the machine's own Debian mirror (never hard-coded here): that of
# the first enabled deb or deb-src entry for the suite bookworm. FILEs ending in .sources are read
# as deb822 stanzas, others as one-line entries ("deb [opt=val ...] URI suite component..."; the
# options block is optional, "#" starts a comment). Without FILEs: apt's own sources, i.e.
# /etc/apt/sources.list.d/*.sources, /etc/apt/sources.list and /etc/apt/sources.list.d/*.list.
# Prints nothing where there is no such entry.
debian_uri() {
  local f uri
  if [ $# -eq 0 ]; then
    set -- /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list
  fi
  for f in "$@"; do
    if [ ! -f "$f" ] || [ ! -r "$f" ]; then continue; fi
    case "$f" in
      *.sources) uri=$(debian_uri_deb822 <"$f") ;;
      *) uri=$(debian_uri_one_line <"$f") ;;
    esac
    if [ -n "$uri" ]; then echo "$uri"; return 0; fi
  done
  return 0
}

# One-line entries on stdin: prints the URI of the first deb/deb-src line whose suite is bookworm.
debian_uri_one_line() {
  awk '{
    line = $0
    sub(/\r$/, "", line); sub(/#.*/, "", line); sub(/^[ \t]+/, "", line)
    if (line !~ /^deb(-src)?[ \t]/) next
    sub(/^deb(-src)?[ \t]+/, "", line)
    if (substr(line, 1, 1) == "[") {                 # options block: [ key=value ... ]
      if (index(line, "]") == 0) next
      line = substr(line, index(line, "]") + 1)
      sub(/^[ \t]+/, "", line)
    }
    n = split(line, t, /[ \t]+/)
    if (n >= 2 && t[2] == "bookworm") { print t[1]; exit }
  }'
}

# deb822 stanzas on stdin: prints the first URI of the first enabled deb/deb-src stanza whose
# Suites include bookworm. Field names are case-insensitive; "#" lines are comments; a line that
# starts with a blank continues the field before it.
debian_uri_deb822() {
  awk 'function check() {
         if (f["types"] ~ /(^|[ \t])deb(-src)?([ \t]|$)/ && tolower(f["enabled"]) != "no" &&
             f["suites"] ~ /(^|[ \t])bookworm([ \t]|$)/ && f["uris"] != "") {
           split(f["uris"], u, /[ \t]+/); print u[1]; found = 1
         }
         split("", f); key = ""
       }
       { sub(/\r$/, "") }
       /^#/ { next }
       /^[ \t]*$/ { check(); if (found) exit; next }
       /^[ \t]/ { if (key != "") { v = $0; sub(/^[ \t]+/, "", v); f[key] = f[key] " " v }; next }
       { i = index($0, ":"); if (i == 0) next
         key = tolower(substr($0, 1, i - 1)); v = substr($0, i + 1)
         sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v); f[key] = v }
       END { if (!found) check() }'
}

# The nearest existing directory at or above $1.
existing_ancestor() {
  local d=$1
  while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname "$d"); done
  echo "$d"
}

main() {
  set -euo pipefail
  local backends="${MESHTENSOR_KOKKOS_BACKENDS:-serial,openmp}"   # comma list: serial,openmp,cuda
  local bench=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --backends) backends="$2"; shift 2 ;;
      --bench) bench=1; shift ;;
      -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
      *) echo "install_deps.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
  done

  local b cuda=0 cuda_arch="${MESHTENSOR_CUDA_ARCH:-HOPPER90}" nvcc_path=""
  for b in ${backends//,/ }; do
    case "$b" in
      serial|openmp) ;;
      cuda) cuda=1 ;;
      *) die "unknown Kokkos backend '$b' in --backends $backends (serial, openmp, cuda)" ;;
    esac
  done
  if [ "$cuda" = 1 ]; then
    nvcc_path=$(command -v nvcc || true)
    if [ -z "$nvcc_path" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc_path=/usr/local/cuda/bin/nvcc; fi
    [ -n "$nvcc_path" ] || die "--backends $backends: the cuda backend needs nvcc (the CUDA toolkit), found neither in PATH nor in /usr/local/cuda/bin"
    case "$cuda_arch" in *[!A-Z0-9]*|"") die "MESHTENSOR_CUDA_ARCH='$cuda_arch': Kokkos's architecture name is expected, e.g. HOPPER90 or AMPERE80" ;; esac
  fi

  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  started=$SECONDS
  did_something=0

  local packages=(g++ cmake make pkg-config libopenmpi-dev openmpi-bin libboost1.81-dev libopenblas-dev
            dataset-fashion-mnist zlib1g-dev gnuplot-nox libbenchmark-dev libcli11-dev libfmt-dev nlohmann-json3-dev
            python3-torch python3-numpy python3-venv libdnnl-dev   # oneDNN: local kernels (MESHTENSOR_DNNL); PyTorch: the meshtensor-lm cross-check (tools/lm) (ctest label crosscheck)
            libfftw3-dev           # FFTW 3: the local transforms of include/meshtensor/fft/ (meshtensor::fft)
            libsentencepiece-dev   # examples/translation's tokenizer; the packages below install its corpus's French catalogs (corpus.hpp)
            sentencepiece          # spm_decode and spm_export_vocab: the PyTorch translation peer's detokenizer in any Python (scripts/dev/bench_translation.sh)
            libc-l10n git gettext gettext-base libdpkg-perl libglib2.0-data gnupg-l10n iso-codes
            clang-14 libclang-rt-14-dev libomp-14-dev   # libFuzzer (ctest label fuzz); LLVM's libomp and Archer (scripts/dev/tsan.sh)
            "${DOCS_PACKAGES[@]}" chromium     # the site (scripts/docs.sh) and its test in a browser (ctest label docs)
            slurmctld slurmd slurm-client)   # a two-node Slurm started by the tests (ctest label slurm; tests/slurm)
  local backports_packages=(catch2)
  # Optional (--bench): Eigen, ScaLAPACK, FFTW's MPI transforms and PETSc (C++ peers), matplotlib
  # (plots), venv and pip (the JAX and Mesh-TensorFlow venvs of scripts/dev/bench_venv.sh).
  local bench_packages=(libeigen3-dev libscalapack-openmpi-dev libfftw3-mpi-dev libpetsc-real-dev python3-matplotlib
                        python3-venv python3-pip)
  if [ "$bench" = 1 ]; then packages+=("${bench_packages[@]}"); fi
  if [ "$cuda" = 1 ]; then packages+=(patch); fi   # applies the CUDA 13 patch to Kokkos

  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  local catch2_version need_catch2=0
  catch2_version=$(dpkg-query -W -f='${Version}' catch2 2>/dev/null || true)
  case "$catch2_version" in 3.*) ;; *) need_catch2=1 ;; esac

  local extra_sources=/etc/apt/sources.list.d/meshtensor-extra.sources
  local need_sources=0 kokkos_needed=0 update=0
  if [ -z "${Kokkos_ROOT:-}" ]; then kokkos_needed=1; fi

  local deps_root="${MESHTENSOR_DEPS_PREFIX:-}"
  if [ -z "$deps_root" ]; then
    if [ "$(id -u)" = 0 ]; then deps_root=/opt/meshtensor-deps; else deps_root="$HOME/.local/meshtensor-deps"; fi
  fi
  case "$deps_root" in /*) ;; *) deps_root="$PWD/$deps_root" ;; esac   # CMake needs it absolute
  local kokkos_prefix d
  kokkos_prefix="$deps_root/kokkos-3.4.01-$(echo "$backends" | tr ',' '-')"
  if [ "$cuda" = 1 ]; then kokkos_prefix="$kokkos_prefix-$(echo "$cuda_arch" | tr 'A-Z' 'a-z')"; fi
  for d in lib lib64; do
    if [ -f "$kokkos_prefix/$d/cmake/Kokkos/KokkosConfig.cmake" ]; then kokkos_needed=0; fi
  done

  if { [ "$need_catch2" = 1 ] || [ "$kokkos_needed" = 1 ]; } && [ ! -f "$extra_sources" ]; then need_sources=1; fi
  if [ ${#missing[@]} -gt 0 ] || [ "$need_catch2" = 1 ] || [ "$need_sources" = 1 ]; then
    if [ -n "$SUDO" ] && ! command -v sudo >/dev/null; then
      die "apt needs root or sudo, and there is no sudo; as root, run this script once (or install: ${missing[*]:-catch2 from bookworm-backports})"
    fi
  fi

  if [ "$need_sources" = 1 ]; then
    local uri
    uri=$(debian_uri)
    if [ -z "$uri" ]; then
      die "no Debian bookworm entry found in /etc/apt/sources.list or /etc/apt/sources.list.d/*.{list,sources}; add one, or install catch2 3.x and set Kokkos_ROOT"
    fi
    log "adding $extra_sources: bookworm-backports (Catch2 3) and deb-src (Kokkos's source) from $uri"
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
    update=1
  fi

  if [ ${#missing[@]} -gt 0 ] || [ "$need_catch2" = 1 ] || [ "$update" = 1 ]; then
    open_log
    log "updating apt's package lists (log: $LOG)"
    run_logged "apt-get update" $SUDO apt-get update
    if [ ${#missing[@]} -gt 0 ]; then
      log "installing ${#missing[@]} Debian packages and what they need: ${missing[*]} (log: $LOG)"
      run_logged "installing Debian packages" \
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
    if [ "$need_catch2" = 1 ]; then
      log "installing Catch2 3 from bookworm-backports (bookworm has only 2.x) (log: $LOG)"
      run_logged "installing catch2 from bookworm-backports" \
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -t bookworm-backports "${backports_packages[@]}"
    fi
  fi

  if [ "$kokkos_needed" = 1 ]; then
    # Install as the user wherever the user can write (their own prefix: no sudo, so nothing under
    # $HOME ends up owned by root); sudo only for a prefix the user cannot write to, such as /opt.
    local install_sudo="" top
    top=$(existing_ancestor "$kokkos_prefix")
    if [ ! -d "$top" ] || [ ! -w "$top" ]; then
      case "$kokkos_prefix/" in
        "${HOME:-/nonexistent}"/*) die "cannot write to $top (owned by $(stat -c %U "$top")), on the way to $kokkos_prefix; under your home nothing should be root's: 'sudo chown -R $(id -un): $top' fixes it, or set MESHTENSOR_DEPS_PREFIX" ;;
      esac
      if [ -z "$SUDO" ] || ! command -v sudo >/dev/null; then
        die "cannot write to $top and there is no sudo; set MESHTENSOR_DEPS_PREFIX to a directory of your own"
      fi
      install_sudo=$SUDO
    else
      mkdir -p "$kokkos_prefix"
    fi
    open_log
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    log "fetching Debian's trilinos source package, 166 MB (Kokkos 3.4.01 is its packages/kokkos) (log: $LOG)"
    run_logged "apt-get source trilinos" in_dir "$work" apt-get source --download-only trilinos
    local orig src
    orig=$(ls "$work"/trilinos_*.orig.tar.*)
    orig=${orig%%$'\n'*}
    run_logged "extracting packages/kokkos" tar -xf "$orig" -C "$work" --wildcards '*/packages/kokkos/*'
    src=$(find "$work" -maxdepth 4 -type d -path '*/packages/kokkos' | head -n1)
    [ -n "$src" ] || die "no packages/kokkos in $orig"
    local cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=20 -DCMAKE_INSTALL_PREFIX="$kokkos_prefix"
                       -DKokkos_ENABLE_SERIAL=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON)
    case ",$backends," in *,openmp,*) cmake_flags+=(-DKokkos_ENABLE_OPENMP=ON) ;; esac
    if [ "$cuda" = 1 ]; then
      run_logged "patching Kokkos for CUDA 13 (scripts/kokkos-3.4.01-cuda13.patch)" \
        patch -p1 -d "$src" -i "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/kokkos-3.4.01-cuda13.patch"
      # nvcc_wrapper calls the nvcc it finds in PATH.
      export PATH="$(dirname "$nvcc_path"):$PATH"
      cmake_flags+=(-DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON "-DKokkos_ARCH_$cuda_arch=ON"
                    -DCMAKE_CXX_COMPILER="$src/bin/nvcc_wrapper")
    fi
    local built="$backends"
    if [ "$cuda" = 1 ]; then built="$backends for $cuda_arch"; fi
    log "building Kokkos 3.4.01 ($built) and installing it into $kokkos_prefix${install_sudo:+ with sudo} (log: $LOG)"
    run_logged "configuring Kokkos from $src" cmake -S "$src" -B "$work/build" "${cmake_flags[@]}"
    run_logged "building Kokkos" cmake --build "$work/build" -j "$(nproc)"
    run_logged "installing Kokkos into $kokkos_prefix" $install_sudo cmake --install "$work/build"
  fi

  # Python's safetensors (PyPI; Debian has none) for the checkpoint test that reads meshtensor's
  # files from Python, and sacrebleu (PyPI; Debian has none) for the BLEU scores of
  # examples/translation, in a virtual environment over Debian's python3 (its numpy and torch).
  local venv="$deps_root/python-checkpoint"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import safetensors, sacrebleu' 2>/dev/null; then
    local venv_sudo=""
    if [ ! -w "$(existing_ancestor "$deps_root")" ]; then venv_sudo=$SUDO; fi
    open_log
    log "creating $venv: Debian's python3 with safetensors and sacrebleu from PyPI, for the checkpoint tests and the translation example (log: $LOG)"
    run_logged "creating the Python environment $venv" $venv_sudo /usr/bin/python3 -m venv --system-site-packages "$venv"
    # One test needs safetensors, nothing else: without PyPI (offline, a proxy pip does not trust)
    # that test is skipped, the rest installs, and the next run tries again.
    echo "+ $venv/bin/python -m pip install safetensors" >>"$LOG"
    if ! $venv_sudo "$venv/bin/python" -m pip install --disable-pip-version-check safetensors </dev/null >>"$LOG" 2>&1; then
      $venv_sudo rm -rf "$venv"
      log "could not install safetensors from PyPI (see $LOG); the test that reads checkpoints from Python" \
          "(checkpoint.python_reads) will be skipped; run this script again once PyPI can be reached"
    else
      # Only the translation example's BLEU scores need sacrebleu: without it the environment is
      # kept for the checkpoint test, and the next run tries again.
      echo "+ $venv/bin/python -m pip install sacrebleu" >>"$LOG"
      if ! $venv_sudo "$venv/bin/python" -m pip install --disable-pip-version-check sacrebleu </dev/null >>"$LOG" 2>&1; then
        log "could not install sacrebleu from PyPI (see $LOG); examples/translation's PyTorch peer cannot score" \
            "BLEU without it; run this script again once PyPI can be reached"
      fi
    fi
  fi

  # transformers 4.44 (PyPI; it runs on Debian's PyTorch 1.13) for the Llama example's cross-check
  # against LlamaForCausalLM (ctest example.llama.hugging_face): without it that test is skipped,
  # and the next run tries again.
  if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -c 'import transformers' 2>/dev/null; then
    local tf_sudo=""
    if [ ! -w "$venv" ]; then tf_sudo=$SUDO; fi
    open_log
    log "installing transformers 4.44 into $venv, for the Llama example's cross-check (log: $LOG)"
    echo "+ $venv/bin/python -m pip install transformers==4.44.2" >>"$LOG"
    if ! $tf_sudo "$venv/bin/python" -m pip install --disable-pip-version-check "transformers==4.44.2" </dev/null >>"$LOG" 2>&1; then
      log "could not install transformers from PyPI (see $LOG); example.llama.hugging_face will be skipped;" \
          "run this script again once PyPI can be reached"
    fi
  fi

  if [ "$did_something" = 1 ]; then log "done in $((SECONDS - started)) s"; fi
  if [ -x "$venv/bin/python" ]; then echo "CHECKPOINT_PYTHON=$venv/bin/python"; else echo "CHECKPOINT_PYTHON="; fi
  if [ -n "${Kokkos_ROOT:-}" ]; then echo "KOKKOS_ROOT=$Kokkos_ROOT"; else echo "KOKKOS_ROOT=$kokkos_prefix"; fi
}

# The log of this run (created, as the user, only once there is something to do): LOG.
open_log() {
  did_something=1
  [ -z "${LOG:-}" ] || return 0
  local dir="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/meshtensor"
  if mkdir -p "$dir" 2>/dev/null && [ -w "$dir" ]; then
    LOG="$dir/install_deps.log"
  else
    LOG=$(mktemp /tmp/meshtensor-install_deps.XXXXXX.log)
  fi
  echo "install_deps.sh, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), as $(id -un)" >"$LOG"
}

# in_dir DIR COMMAND...: runs COMMAND in DIR (in a subshell).
in_dir() ( cd "$1" && shift && "$@" )

# run_logged WHAT COMMAND...: runs COMMAND with its output appended to LOG; on failure, shows the
# log's tail and its path, and stops.
run_logged() {
  local what=$1; shift
  echo "+ $*" >>"$LOG"
  if ! "$@" </dev/null >>"$LOG" 2>&1; then
    echo "install_deps.sh: $what failed; the last lines of $LOG:" >&2
    tail -n 30 "$LOG" | sed 's/^/  /' >&2
    die "$what failed (full log: $LOG)"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
