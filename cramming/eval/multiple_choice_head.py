"""The "multiple-choice" head (SWAG, RACE): AutoModelForMultipleChoice on (batch, choices, tokens) inputs.

Each choice is encoded with its context as the pair (context, choice) and scored by one logit; the loss is the
model's own cross-entropy over a question's choices and the prediction its argmax, scored as accuracy in percent
(GLUE's metrics). Truncation cuts the context only, so every choice survives whole: a passage question is answered
from the passage's beginning, never from half an option. Only a choice too long to fit beside one context token
is cut too (longest_first). Rows are padded per batch and bucketed by length (finetune.run_epochs).
"""

import sys
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers import AutoModelForMultipleChoice

from ..model.block import BLOCKS
from ..model.positions import POSITIONS
from .finetune import Head, auto_model, collate


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
    contexts = [e.context for e in examples for _ in e.choices]
    choices = [c for e in examples for c in e.choices]
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
    out, start = [], 0
    for e in examples:
        out.append(flat[start:start + len(e.choices)])
        start += len(e.choices)
    return out


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
    """One question, encoded: a (context, choice) row per choice."""

    rows: list[list[int]]
    label: int


class MultipleChoice(Head):
    def build(self, checkpoint, task, recipe, random_init):
        return auto_model(AutoModelForMultipleChoice, checkpoint, random_init, recipe.dropout)

    def max_length(self, model_config, recipe, label):
        return effective_length(model_config, recipe.max_length, label)

    def encode(self, tokenizer, task, rows, max_length):
        return [Question(ids, row.label) for ids, row in zip(encode_choices(tokenizer, rows, max_length), rows)]

    def length(self, item):
        return max(map(len, item.rows)) * len(item.rows)

    def collate(self, items, pad_id, device):
        return collate_choices([item.rows for item in items], pad_id, device)

    def loss(self, model, inputs, items):
        labels = torch.tensor([item.label for item in items], device=inputs["input_ids"].device)
        return model(**inputs, labels=labels).loss

    def decode(self, outputs, items, task):
        return outputs.logits.float().argmax(-1).tolist()
