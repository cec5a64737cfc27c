#!/usr/bin/env bash
# Creates the virtual environment of the Python peers of the benchmarks (JAX, Mesh-TensorFlow with
# TensorFlow), with pip from the package index pip is configured for. Idempotent.
#   scripts/bench_venv.sh [DIR]      (default: .venv-bench at the repository root)
# PyTorch is not installed here: the benchmarks use Debian's python3-torch (scripts/install_deps.sh
# --bench), so the venv sees the system site-packages.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${1:-$root/.venv-bench}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.meshtensor-bench-ok"
if [ ! -f "$stamp" ]; then
  "$venv/bin/python" -m pip install -q "jax[cpu]" jaxlib tensorflow-cpu mesh-tensorflow
  touch "$stamp"
fi
echo "$venv"
