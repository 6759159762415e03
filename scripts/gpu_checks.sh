#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one command: scripts/gpu_checks.py says what runs; docs/benchmarks.md says
# how to run it on a GPU machine, also one that reaches no package registry.
#   python scripts/fetch_wheels.py                # once, on a machine with internet: what the GPU machine's
#                                                 # python3 lacks, as wheels in .whl/
#   mkdir -p .glue && cp -r <your glue_data>/RTE .glue/   # the GLUE task the product is evaluated on
#   (copy the checkout, with .whl/ and .glue/, to the GPU machine)
#   bash scripts/gpu_checks.sh                    # there: 9 minutes at most; results in a new folder
#                                                 # outputs/gpu_checks/<date>_<time>/ of the checkout
#   bash scripts/gpu_checks.sh --out <folder>     # the same, results in <folder> (empty or new)
#   bash scripts/gpu_checks.sh --rehearsal        # here: the same steps on CPU at tiny sizes (GPU_CHECKS_REHEARSAL=1)
# Then read <results>/summary.md. It runs python3 (that machine's, with its own torch), or .venv's python in a
# rehearsal; PY overrides either. Relative paths in the options are taken from where you run it.
set -euo pipefail
GPU_CHECKS_CALLER_DIR=$PWD
export GPU_CHECKS_CALLER_DIR
cd "$(dirname "$0")/.."
rehearsal=${GPU_CHECKS_REHEARSAL:-0}
for arg in "$@"; do if [ "$arg" = --rehearsal ]; then rehearsal=1; fi; done
if [ "$rehearsal" = 1 ]; then PY=${PY:-.venv/bin/python}; else PY=${PY:-python3}; fi
if ! command -v "$PY" > /dev/null; then
  echo "error: PY=$PY is not a python here; set PY to one (a rehearsal uses .venv/bin/python: bash scripts/setup.sh)" >&2
  exit 2
fi
GPU_CHECKS_REHEARSAL=$rehearsal exec "$PY" scripts/gpu_checks.py "$@"
