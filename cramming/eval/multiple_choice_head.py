"""The heads that pick one of a question's choices: "multiple-choice" (SWAG, RACE) and candidate scoring (COPA,
ReCoRD). Each choice is encoded with its context as the pair (context, choice) and scored by one logit.

"multiple-choice" is AutoModelForMultipleChoice on (batch, choices, tokens) inputs: its own cross-entropy over a
question's choices, the argmax as prediction, scored as accuracy in percent (GLUE's metrics). Truncation cuts the
context only, so every choice survives whole: a passage question is answered from the passage's beginning, never
from half an option. Only a choice too long to fit beside one context token is cut too (longest_first).

Candidate scoring follows the SuperGLUE BERT baseline: a one-logit sequence classifier on each (context, option)
pair, the best-scoring option the answer. COPA trains that score with a softmax over its two choices; ReCoRD, whose
queries may have several right entities, trains each entity's score on its own with a logistic loss ("the
probability of each candidate independent of the others", as the baseline did).
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import AutoModelForMultipleChoice

from ..model.modeling_crammed import BLOCKS
from ..model.positions import POSITIONS
from .classifier_head import build_classifier
from .finetune import Head, auto_model, clipped, collate


@dataclass
class ChoiceExample:
    """A question with its choices: `context` is the first segment of every pair, each choice the second (already
    joined with its question or sentence start); `label` the right choice's index."""

    context: str
    choices: list[str]
    label: int
    level: str | None = None  # RACE: high or middle


def token_limit(config) -> int | None:
    """The most tokens a crammed checkpoint takes: its position table's rows (learned or sinusoidal positions) or a
    fixed-length block's size (gMLP); None where positions extrapolate (rotary, ALiBi, none) or for other models."""
    if getattr(config, "model_type", None) != "crammed":
        return getattr(config, "max_position_embeddings", None)
    fixed = POSITIONS[config.position].table is not None or any(
        BLOCKS.trait(kind, "fixed_length") for kind in config.layout)
    return config.max_seq_length if fixed else None


def encode_choices(tokenizer, examples, max_length: int) -> list[list[list[int]]]:
    """Token ids of every (context, choice) pair, per example. The context is truncated (only_first); a pair whose
    choice alone fills max_length is cut on both sides (longest_first), as only_first cannot fit it."""
    contexts = clipped([e.context for e in examples for _ in e.choices], max_length)
    choices = clipped([c for e in examples for c in e.choices], max_length)
    room = max_length - tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids) for ids in tokenizer(choices, add_special_tokens=False)["input_ids"]] if choices else []
    flat: list = [None] * len(choices)
    for strategy, fits in (("only_first", True), ("longest_first", False)):
        rows = [i for i, n in enumerate(lengths) if (n < room) == fits]
        if rows:
            ids = tokenizer([contexts[i] for i in rows], [choices[i] for i in rows], truncation=strategy,
                            max_length=max_length)["input_ids"]
            for i, row in zip(rows, ids):
                flat[i] = row
    return per_question(flat, [len(e.choices) for e in examples])


def per_question(flat: list, counts: list[int]) -> list[list]:
    """The flat list of every question's rows, cut back into one list per question."""
    return [flat[start:end] for start, end in pairwise(np.cumsum([0, *counts]))]


def collate_choices(questions: list[list[list[int]]], pad_id: int, device) -> dict:
    """(batch, choices, width) ids and mask, padded to the batch's longest row."""
    batch = collate([row for rows in questions for row in rows], pad_id, device)
    shape = (len(questions), len(questions[0]), -1)
    return {key: value.reshape(shape) for key, value in batch.items()}


def effective_length(model_config, max_length: int, label: str) -> int:
    """max_length, or the checkpoint's token limit where that is shorter (said, never silently)."""
    limit = token_limit(model_config)
    if limit is not None and max_length > limit:
        tqdm.write(f"{label}: eval.recipe.max_length={max_length} is cut to {limit}, the checkpoint's longest input "
                   "(its position table: arch.max_seq_length)", file=sys.stdout)
        return limit
    return max_length


@dataclass
class Question:
    """One question, encoded: a (context, choice) row per choice, and the right one (candidates: every right one)."""

    rows: list[list[int]]
    label: int | list[int]


class Choices(Head):
    """An item is a question: as long as its rows padded to the longest."""

    def length(self, item):
        return max(map(len, item.rows)) * len(item.rows)


class MultipleChoice(Choices):
    def build(self, checkpoint, task, recipe, random_init):
        return auto_model(AutoModelForMultipleChoice, checkpoint, random_init, recipe.dropout)

    def max_length(self, model_config, recipe, label):
        return effective_length(model_config, recipe.max_length, label)

    def encode(self, tokenizer, task, rows, max_length):
        return [Question(ids, row.label) for ids, row in zip(encode_choices(tokenizer, rows, max_length), rows)]

    def collate(self, items, pad_id, device):
        return collate_choices([item.rows for item in items], pad_id, device)

    def decode(self, outputs, items, task):
        return outputs.logits.float().argmax(-1).tolist()


# ---------------------------------------------------------------- candidate scoring (COPA, ReCoRD)


def encode_options(tokenizer, questions, max_length: int) -> list[list[list[int]]]:
    """Token ids of every (context, option) pair, per question; truncation cuts the context first."""
    contexts = clipped([q.context for q in questions for _ in q.options], max_length)
    options = clipped([o for q in questions for o in q.options], max_length)
    ids = tokenizer(contexts, options, truncation="longest_first", max_length=max_length)["input_ids"]
    return per_question(ids, [len(q.options) for q in questions])


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


@dataclass(frozen=True)
class CandidateScoring(Choices):
    """A one-logit head over (context, option) pairs, trained with `objective`; the answer is the best option."""

    objective: Callable  # (logits, options per question, golds) -> loss: softmax_loss or logistic_loss

    def build(self, checkpoint, task, recipe, random_init):
        return build_classifier(checkpoint, task, recipe.dropout, random_init)

    def encode(self, tokenizer, task, rows, max_length):
        return [Question(ids, row.gold) for ids, row in zip(encode_options(tokenizer, rows, max_length), rows)]

    def collate(self, items, pad_id, device):
        return collate([row for item in items for row in item.rows], pad_id, device)

    def loss(self, model, inputs, items):
        logits = model(**inputs).logits[:, 0].float()
        return self.objective(logits, [len(item.rows) for item in items], [item.label for item in items])

    def decode(self, outputs, items, task):
        scores = torch.split(outputs.logits[:, 0].float(), [len(item.rows) for item in items])
        return [int(options.argmax()) for options in scores]
