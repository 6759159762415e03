#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one call: scripts/gpu_checks.py says what runs; docs/benchmarks.md says how
# to run it on the H200 test machine, which reaches no package registry.
#   .venv/bin/python scripts/fetch_wheels.py      # here, once: what that machine lacks, as wheels in .whl/
#   mkdir -p .glue && cp -r ../shared/data/glue/RTE .glue/   # here: the GLUE task the product is evaluated on
#   bash scripts/gpu_checks.sh                    # there, with .whl and .glue carried: 9 minutes at most; in $OUT
#   bash scripts/gpu_checks.sh --rehearsal        # here: the same steps on CPU at tiny sizes (GPU_CHECKS_REHEARSAL=1)
# It runs python3 (that machine's, with its own torch), or .venv's python in a rehearsal; PY overrides either.
set -euo pipefail
cd "$(dirname "$0")/.."
rehearsal=${GPU_CHECKS_REHEARSAL:-0}
for arg in "$@"; do if [ "$arg" = --rehearsal ]; then rehearsal=1; fi; done
if [ "$rehearsal" = 1 ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
if ! command -v "$PY" > /dev/null; then
  echo "error: PY=$PY is not a python here; set PY to one (a rehearsal uses .venv/bin/python: bash scripts/setup.sh)" >&2
  exit 2
fi
GPU_CHECKS_REHEARSAL=$rehearsal exec "$PY" scripts/gpu_checks.py "$@"
