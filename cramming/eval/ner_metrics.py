"""Entity-level precision, recall and F1 for IOB-tagged sequences, as conlleval and seqeval's default mode count them.

Tags are `O`, `B-<type>` or `I-<type>`; both IOB1 (the original CoNLL-2003: `B-` only between two adjacent entities
of one type) and IOB2 (`B-` at every entity's start) read the same way:
- an entity starts at a `B-` tag, and at an `I-` tag that follows `O` or a tag of another type;
- it ends before `O`, before a `B-` tag, and before a tag of another type.
So `I-PER I-PER B-PER` is two entities, `I-PER I-LOC` two (one of each type), and a sentence may end inside one.
A predicted entity counts as correct only if its type, start and end all equal a gold entity's.
"""

import re
from collections import Counter

TAG = re.compile(r"^(?:O|[BI]-\S+)$")


def valid_tag(tag: str) -> bool:
    """O, B-<type> or I-<type> (IOB1 or IOB2); other schemes (IOBES's E-, S-) are not read."""
    return bool(TAG.match(tag))


def _split(tag: str) -> tuple[str, str]:
    return ("O", "") if tag == "O" else (tag[0], tag[2:])


def entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first word, one past the last word) of every entity in one sentence, in order."""
    found, start, kind = [], None, ""
    for i, tag in enumerate(tags):
        prefix, this = _split(tag)
        if start is not None and (prefix != "I" or this != kind):  # O, B-, or another type closes the open entity
            found.append((kind, start, i))
            start = None
        if prefix != "O" and start is None:  # B-, or an I- that follows O or another type, opens one
            start, kind = i, this
    if start is not None:
        found.append((kind, start, len(tags)))
    return found


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 over all entities, in percent (x100, as the GLUE metrics), plus
    `f1_<type>` for every type that occurs in the gold or the predicted tags. Zero denominators give 0."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(predicted)} predicted sentences for {len(gold)} gold ones")
    hits, n_gold, n_pred = Counter(), Counter(), Counter()
    for number, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {number}: {len(p)} predicted tags for {len(g)} words")
        gold_set, pred_set = set(entities(g)), set(entities(p))
        n_gold.update(kind for kind, _, _ in gold_set)
        n_pred.update(kind for kind, _, _ in pred_set)
        hits.update(kind for kind, _, _ in gold_set & pred_set)
    scores = _prf(sum(hits.values()), sum(n_gold.values()), sum(n_pred.values()))
    for kind in sorted(set(n_gold) | set(n_pred)):
        scores[f"f1_{kind}"] = _prf(hits[kind], n_gold[kind], n_pred[kind])["f1"]
    return scores


def _prf(hits: int, n_gold: int, n_pred: int) -> dict[str, float]:
    precision = hits / n_pred if n_pred else 0.0
    recall = hits / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return {"precision": 100.0 * precision, "recall": 100.0 * recall, "f1": 100.0 * f1}
