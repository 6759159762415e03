"""SuperGLUE's official metrics, computed locally, and the SuperGLUE average.

Every task's scorer returns percent (x100) and a "score" key: the task's one number in the SuperGLUE average
(the unweighted mean of its metrics where it has two: CB accuracy and macro F1, MultiRC F1a and exact match,
ReCoRD token F1 and exact match). scikit-learn computes what it has; ReCoRD's token F1 and exact match are
SQuAD v1.1's (squad_metrics.py), MultiRC's per-question exact match is written here.
"""

import math
from collections import defaultdict

import numpy as np
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from .glue_metrics import _pair  # the same shape and emptiness checks as GLUE's metrics
from .squad_metrics import exact_match
from .squad_metrics import f1 as squad_f1

SUPERGLUE_SET = ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc")  # averaged
DIAGNOSTICS = ("axb", "axg")  # reported beside the average, never in it


def accuracy(predictions, references) -> dict:
    p, r = _pair(predictions, references)
    acc = 100.0 * accuracy_score(r, p)
    return {"accuracy": acc, "score": acc}


def cb_scores(predictions, references) -> dict:
    """CommitmentBank: accuracy and the macro F1 over its three classes, averaged for the score."""
    p, r = _pair(predictions, references)
    acc = 100.0 * accuracy_score(r, p)
    macro = 100.0 * f1_score(r, p, labels=[0, 1, 2], average="macro", zero_division=0)
    return {"accuracy": acc, "f1_macro": macro, "score": (acc + macro) / 2}


def multirc_scores(predictions, references, questions) -> dict:
    """MultiRC: F1a, the binary F1 over every answer option, and EM, the share of questions whose every
    answer option is classified right; `questions` gives each option's question (any hashable)."""
    p, r = _pair(predictions, references)
    if len(questions) != p.size:
        raise ValueError(f"{len(questions)} question ids for {p.size} answers")
    f1a = 100.0 * f1_score(r, p, pos_label=1, average="binary", zero_division=0)
    right = defaultdict(lambda: True)
    for question, pred, ref in zip(questions, p, r):
        right[question] &= bool(pred == ref)
    em = 100.0 * sum(right.values()) / len(right)
    return {"f1a": f1a, "exact_match": em, "score": (f1a + em) / 2}


def record_scores(predictions: list[str], answers: list[list[str]]) -> dict:
    """ReCoRD: token F1 and exact match of each predicted entity against the best-matching gold answer
    (max over a query's answers), averaged over queries; a query without answers scores 0."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} queries")
    if not predictions:
        raise ValueError("no predictions to score")
    f1s = [max((squad_f1(g, p, version=1) for g in golds), default=0.0) for p, golds in zip(predictions, answers)]
    ems = [max((float(exact_match(g, p)) for g in golds), default=0.0) for p, golds in zip(predictions, answers)]
    f1, em = 100.0 * float(np.mean(f1s)), 100.0 * float(np.mean(ems))
    return {"f1": f1, "exact_match": em, "score": (f1 + em) / 2}


def axb_scores(predictions, references) -> dict:
    """AX-b, the broad-coverage diagnostic: Matthews correlation (0 when a side is constant)."""
    p, r = _pair(predictions, references)
    mcc = 100.0 * matthews_corrcoef(r, p)
    return {"matthews": mcc, "score": mcc}


def axg_scores(predictions, references, pairs) -> dict:
    """AX-g (Winogender): accuracy, and gender parity, the share of pronoun-swapped pairs (same `pairs` id)
    given the same prediction. The score is the accuracy; parity is beside it."""
    p, r = _pair(predictions, references)
    members = defaultdict(list)
    for pair, pred in zip(pairs, p):
        members[pair].append(pred)
    sizes = {len(v) for v in members.values()}
    if sizes != {2}:
        raise ValueError(f"AX-g pairs must have two members each, got sizes {sorted(sizes)}")
    parity = 100.0 * float(np.mean([a == b for a, b in members.values()]))
    acc = 100.0 * accuracy_score(r, p)
    return {"accuracy": acc, "gender_parity": parity, "score": acc}


def superglue_average(scores: dict[str, float]) -> dict:
    """The mean of the eight tasks' scores present in `scores` (keys as SUPERGLUE_SET); AX-b and AX-g go in
    `diagnostics`, not in the mean. With nothing counted the average is nan."""
    counted = [k for k in SUPERGLUE_SET if k in scores]
    average = float(np.mean([scores[k] for k in counted])) if counted else math.nan
    return {"average": average, "tasks_counted": counted,
            "diagnostics": {k: scores[k] for k in DIAGNOSTICS if k in scores}}
