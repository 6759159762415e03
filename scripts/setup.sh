#!/usr/bin/env bash
# Create .venv and install cramming: `setup.sh` with its test extras ([dev], for scripts/test.sh), `setup.sh core`
# the package alone (what the quickstart runs). Safe to re-run (fast when all is installed).
# torch goes in first, pinned, so nothing later pulls another (multi-GB CUDA) build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=".venv/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # Pinned first, before anything that depends on torch. On our CPU machines pip finds a local CPU wheel of
  # this version; on a CPU machine elsewhere, set PIP_INDEX_URL=https://download.pytorch.org/whl/cpu first
  # to avoid the multi-GB CUDA build that PyPI serves for Linux.
  $PIP install -q "torch==2.13.0"
fi
if [ "${1:-dev}" = core ]; then
  $PIP install -q -e .
else
  $PIP install -q -e ".[dev]"
fi
