"""Metrics for GLUE dev sets and the GLUE averages, with scikit-learn and scipy (no downloads, no `evaluate`).

The plain functions return fractions (accuracy 0..1, correlations -1..1), the usual convention.
`compute_metrics` and `glue_average` work in percent (x100), as the Cramming paper and GLUE report them,
so a `compute_metrics` result can go straight into `glue_average`.

Degenerate inputs never raise: a correlation that is undefined because one side is constant
(e.g. a collapsed model predicting one class or one score) is reported as 0, i.e. "no correlation".
"""

import math
from collections.abc import Callable

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from .tasks import GLUE_KEYS  # glue_average's score keys, from the one table of GLUE's tasks

# The harmonic mean is undefined at <= 0 (Matthews can be 0 or negative): scores are clipped up to this
# floor, in percent, so one failed task drags the harmonic mean down hard instead of breaking it.
HARMONIC_FLOOR = 1.0


def _pair(predictions, references) -> tuple[np.ndarray, np.ndarray]:
    p, r = np.asarray(predictions).ravel(), np.asarray(references).ravel()
    if p.shape != r.shape:
        raise ValueError(f"{p.size} predictions for {r.size} references")
    if p.size == 0:
        raise ValueError("no predictions to score")
    return p, r


def accuracy(predictions, references) -> float:
    p, r = _pair(predictions, references)
    return float(accuracy_score(r, p))


def f1(predictions, references) -> float:
    """Binary F1 of the positive class 1 (MRPC "equivalent", QQP "duplicate"); 0 when it never occurs."""
    p, r = _pair(predictions, references)
    return float(f1_score(r, p, labels=[1], average="micro", zero_division=0))


def matthews(predictions, references) -> float:
    """Matthews correlation (multi-class form, Gorodkin 2004); 0 when either side is constant."""
    p, r = _pair(predictions, references)
    return float(matthews_corrcoef(r, p))


def pearson(predictions, references) -> float:
    """Pearson correlation; 0 (not nan) when either side is constant, where it is undefined."""
    p, r = _pair(predictions, references)
    p, r = p.astype(np.float64) - p.mean(), r.astype(np.float64) - r.mean()
    denom = math.sqrt(float(p @ p) * float(r @ r))
    return float(np.clip(p @ r / denom, -1.0, 1.0)) if denom else 0.0


def spearman(predictions, references) -> float:
    """Spearman correlation: Pearson of the ranks (ties get their average rank); 0 when constant."""
    p, r = _pair(predictions, references)
    return pearson(rankdata(p), rankdata(r))


METRICS: dict[str, Callable] = {
    "accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson, "spearman": spearman,
}


def compute_metrics(metric_names: list[str], predictions, references) -> dict[str, float]:
    """Each named metric, in percent (x100). Predictions are class ids, or floats for regression."""
    unknown = [m for m in metric_names if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    return {name: 100.0 * METRICS[name](predictions, references) for name in metric_names}


def glue_average(task_scores: dict[str, float], include_wnli: bool = False) -> dict:
    """Mean and harmonic mean of main-metric scores in percent, keyed as in GLUE_KEYS.

    MNLI counts twice ("mnli-m" and "mnli-mm"), as in the GLUE leaderboard and the Cramming paper.
    WNLI is left out unless `include_wnli` (the paper leaves it out: models score at or below the
    majority baseline). Tasks missing from `task_scores` are simply not counted: see `tasks_counted`.
    The harmonic mean clips each score up to HARMONIC_FLOOR percent first. With nothing counted both are nan.
    """
    unknown = sorted(set(task_scores) - set(GLUE_KEYS))
    if unknown:
        raise ValueError(f"unknown GLUE score key(s) {', '.join(unknown)}; use {', '.join(GLUE_KEYS)}")
    counted = [k for k in GLUE_KEYS if k in task_scores and (include_wnli or k != "wnli")]
    if not counted:
        return {"average": math.nan, "harmonic_mean": math.nan, "tasks_counted": []}
    scores = np.array([task_scores[k] for k in counted], dtype=np.float64)
    floored = np.maximum(scores, HARMONIC_FLOOR)
    return {
        "average": float(scores.mean()),
        "harmonic_mean": float(len(floored) / np.sum(1.0 / floored)),
        "tasks_counted": counted,
    }
