"""Evaluation's components: the benchmarks `eval.kind` names, their tasks' readers, the heads that fine-tune them and
the metrics (registered in one place: kinds.py); the recipe that runs them is recipe.py."""
