#!/usr/bin/env bash
# Command 1: install, then pretrain a tiny crammed BERT on the embedded python-docs corpus for a short
# budget (3 minutes by default; BUDGET=<hours> to change) and report its validation loss.
# Extra arguments go to pretrain.py, e.g. `bash scripts/quickstart.sh arch=crammed-bert-mini`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python pretrain.py name=quickstart arch=crammed-bert-tiny train=cpu-smoke budget="${BUDGET:-0.05}" "$@"
