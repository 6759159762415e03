"""Candidate scoring for SuperGLUE's COPA and ReCoRD (trained by finetune.run_epochs, as every head).

As in the SuperGLUE BERT baseline, each (context, option) pair goes through the encoder and a one-logit head on
the pooled first token; the highest-scoring option is the answer. COPA trains that score with a softmax over
its two choices (multiple choice); ReCoRD, whose queries may have several right entities, trains each
entity's score on its own with a logistic loss ("the probability of each candidate independent of the
others", as the baseline did), and predicts the best-scoring one per query.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .classifier_head import build_classifier
from .finetune import Head, collate


def encode_options(tokenizer, questions, max_length: int) -> list[list[list[int]]]:
    """Token ids of every (context, option) pair, per question; truncation cuts the context first."""
    contexts = [q.context for q in questions for _ in q.options]
    options = [o for q in questions for o in q.options]
    ids = tokenizer(contexts, options, truncation="longest_first", max_length=max_length)["input_ids"]
    out, start = [], 0
    for q in questions:
        out.append(ids[start:start + len(q.options)])
        start += len(q.options)
    return out


def softmax_loss(logits: torch.Tensor, sizes: list[int], golds: list[list[int]]) -> torch.Tensor:
    """Cross-entropy over each question's options (COPA: its one right choice)."""
    losses = [F.cross_entropy(chunk[None], torch.tensor([gold[0]], device=chunk.device))
              for chunk, gold in zip(torch.split(logits, sizes), golds)]
    return torch.stack(losses).mean()


def logistic_loss(logits: torch.Tensor, sizes: list[int], golds: list[list[int]]) -> torch.Tensor:
    """Each option on its own: is it a right answer? (ReCoRD: none, one or several per query.)"""
    targets = torch.zeros_like(logits)
    offsets = np.cumsum([0, *sizes[:-1]])
    for offset, gold in zip(offsets, golds):
        targets[[int(offset) + g for g in gold]] = 1.0
    return F.binary_cross_entropy_with_logits(logits, targets)


@dataclass
class Question:
    """A question's (context, option) rows, and its right options' indices."""

    rows: list[list[int]]
    gold: list[int]


@dataclass(frozen=True)
class CandidateScoring(Head):
    """A one-logit head over (context, option) pairs, trained with `objective`; the answer is the best option."""

    objective: Callable  # (logits, options per question, golds) -> loss: softmax_loss or logistic_loss

    def build(self, checkpoint, task, recipe, random_init):
        return build_classifier(checkpoint, task, recipe.dropout, random_init)

    def encode(self, tokenizer, task, rows, max_length):
        return [Question(ids, row.gold) for ids, row in zip(encode_options(tokenizer, rows, max_length), rows)]

    def length(self, item):
        return max(map(len, item.rows)) * len(item.rows)

    def collate(self, items, pad_id, device):
        return collate([row for item in items for row in item.rows], pad_id, device)

    def loss(self, model, inputs, items):
        logits = model(**inputs).logits[:, 0].float()
        return self.objective(logits, [len(item.rows) for item in items], [item.gold for item in items])

    def decode(self, outputs, items, task):
        scores = torch.split(outputs.logits[:, 0].float(), [len(item.rows) for item in items])
        return [int(options.argmax()) for options in scores]
