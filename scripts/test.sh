#!/usr/bin/env bash
# Command 2: install, then run the whole test suite (CPU, a few minutes). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
.venv/bin/python -m pytest -q "$@"
