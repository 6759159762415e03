"""The official SQuAD metrics (evaluate-v1.1.py and evaluate-v2.0.py), computed locally: exact match and token F1
after the same normalisation (lowercase, punctuation and the articles a/an/the removed, whitespace collapsed),
each the best over a question's gold answers, reported x100 as every other metric here.

v2.0: an unanswerable question scores 1 exactly when the prediction is empty; gold answers that normalise to
nothing are dropped (as its script does); the HasAns_/NoAns_ scores split the questions by whether they have one.
"""

import re
import string
from collections import Counter

PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1(gold: str, prediction: str, version: int = 2) -> float:
    """Token F1. v2.0 scores two empty answers 1 (a right "no answer"); v1.1's script scored every empty one 0."""
    gold_tokens, predicted = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if version == 2 and (not gold_tokens or not predicted):
        return float(gold_tokens == predicted)
    same = sum((Counter(gold_tokens) & Counter(predicted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def question_scores(golds: list[str], prediction: str, version: int) -> tuple[int, float]:
    """(exact, f1) of one question: the best over its gold answers; v2.0 reads no answer as the gold ''."""
    if version == 2:
        golds = [g for g in golds if normalize_answer(g)] or [""]
    return (max(exact_match(g, prediction) for g in golds),
            max(f1(g, prediction, version) for g in golds))


def squad_scores(predictions: dict[str, str], examples, version: int) -> dict[str, float]:
    """exact and f1 over `examples` (x100); v2.0 adds HasAns_exact/_f1 and NoAns_exact/_f1 where such questions
    exist. A question without a prediction scores 0 (v1.1's rule; v2.0's script leaves it out; the head answers
    every question, so neither applies to our runs)."""
    rows = [(bool(e.answers), *question_scores([t for t, _ in e.answers], predictions.get(e.id, ""), version))
            if e.id in predictions else (bool(e.answers), 0, 0.0) for e in examples]
    out = _mean(rows, "")
    if version == 2:
        for prefix, has in (("HasAns_", True), ("NoAns_", False)):
            subset = [r for r in rows if r[0] is has]
            if subset:
                out |= _mean(subset, prefix)
    return out


def _mean(rows, prefix: str) -> dict[str, float]:
    n = len(rows)
    return {f"{prefix}exact": 100.0 * sum(r[1] for r in rows) / n, f"{prefix}f1": 100.0 * sum(r[2] for r in rows) / n}
