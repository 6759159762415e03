#!/usr/bin/env bash
# Command 2: install, then run the whole test suite (CPU; about 20 minutes on 2 cores, 18 of them the tests).
# Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
# One worker per core (pytest-xdist, one torch thread each), a test file kept on one worker with its fixtures.
.venv/bin/python -m pytest -q -n auto --dist loadfile "$@"
