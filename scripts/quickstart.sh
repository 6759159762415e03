#!/usr/bin/env bash
# Command 1: install, pretrain a tiny crammed BERT on the embedded python-docs corpus for a short budget
# (3 minutes by default; BUDGET=<hours> to change), then fine-tune it on whatever GLUE data is reachable:
# the glue_data/ folder named by GLUE_DIR, else the Hugging Face hub. Tasks whose data is missing are
# skipped and named. Extra arguments go to pretrain.py, e.g. `bash scripts/quickstart.sh arch=crammed-bert-mini`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh core  # the package alone: the test extras are scripts/test.sh's
log=$(mktemp)
.venv/bin/python pretrain.py name=quickstart arch=crammed-bert-tiny train=cpu-smoke budget="${BUDGET:-0.05}" "$@" | tee "$log"
checkpoint=$(tail -n 1 "$log" | sed -n 's/^checkpoint: //p')
rm -f "$log"
[ -n "$checkpoint" ] || { echo "pretraining printed no checkpoint" >&2; exit 1; }

cat <<'NOTE'
What to expect: a few minutes of CPU pretraining lower the validation MLM loss (the line above, untrained -> end),
but they do not buy GLUE points yet: the scores below sit near chance (majority class, MCC 0), as they should at
this scale. What a longer CPU budget buys, against Hugging Face's recipe and the random-init twin, is measured by
the record run (python scripts/record.py, about 2 hours on 2 cores): docs/results.md. Cramming's published day on one
GPU reaches GLUE 78.6.
NOTE
echo "GLUE data: ${GLUE_DIR:-the Hugging Face hub (set GLUE_DIR=<glue_data folder> to use local files)}"
[ -n "${GLUE_DIR:-}" ] || unset GLUE_DIR  # an empty GLUE_DIR means none, as the line above says (eval.py refuses it)
# A smoke-sized fine-tuning (1,000 examples, 2 epochs per task; QNLI left out: its dev set of 5,463 long pairs is
# larger than the other five tasks' together, 4,100): the scores are marked "not comparable".
if ! .venv/bin/python eval.py checkpoint="$checkpoint" eval.tasks=[cola,sst2,mrpc,stsb,rte] \
     eval.skip_missing=true eval.max_train_examples=1000 eval.recipe.epochs=2; then
  echo "GLUE evaluation skipped: no GLUE task data was reachable (see the error above). The checkpoint is ready:"
  echo "checkpoint: $checkpoint"
fi
