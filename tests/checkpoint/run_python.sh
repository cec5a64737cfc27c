#!/usr/bin/env bash
# Runs a Python check with $PYTHON if it has safetensors, numpy and torch; exit 77 (ctest: skipped)
# with the reason otherwise.
set -euo pipefail
if [ -z "${PYTHON:-}" ] || [ ! -x "$PYTHON" ]; then
  echo "skipped: no python with safetensors (run scripts/install_deps.sh, which makes one, then re-configure)"
  exit 77
fi
if ! "$PYTHON" -c 'import safetensors, numpy, torch' 2>/dev/null; then
  echo "skipped: $PYTHON lacks safetensors, numpy or torch"
  exit 77
fi
exec "$PYTHON" "$@"
