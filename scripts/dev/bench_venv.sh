#!/usr/bin/env bash
# Creates the virtual environments of the Python peers of the benchmarks, with pip from the package
# index pip is configured for. Idempotent. Prints the two venv directories.
#   scripts/dev/bench_venv.sh [PREFIX]   (default PREFIX: .venv-bench at the repository root)
#   PREFIX      JAX (jax, jaxlib; CPU)
#   PREFIX-mtf  Mesh-TensorFlow 0.1.21 (its last release, 2022) on tensorflow-cpu 2.12.1: it
#               imports tf.compat.v1.estimator (gone in TensorFlow 2.16) and
#               tensorflow.python.framework.ops.register_tensor_conversion_function (moved out in
#               2.13+), and 2.12 is the first with Python 3.11 wheels. It needs numpy < 1.24, which
#               is why JAX lives in a venv of its own.
# PyTorch is not installed here: the benchmarks use Debian's python3-torch with /usr/bin/python3
# (scripts/install_deps.sh --bench).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv="${1:-$root/.venv-bench}"

make_venv() {  # dir, packages...
  local dir="$1"; shift
  [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
  if [ ! -f "$dir/.meshtensor-bench-ok" ]; then
    "$dir/bin/python" -m pip install -q "$@" >&2
    touch "$dir/.meshtensor-bench-ok"
  fi
  echo "$dir"
}
make_venv "$venv" "jax[cpu]" jaxlib
make_venv "$venv-mtf" "tensorflow-cpu==2.12.1" "tensorflow-estimator==2.12.0" "numpy<1.24" mesh-tensorflow
