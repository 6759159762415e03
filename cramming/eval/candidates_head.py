"""Candidate scoring for SuperGLUE's COPA and ReCoRD (trained by finetune.run_epochs, as every head).

As in the SuperGLUE BERT baseline, each (context, option) pair goes through the encoder and a one-logit head on
the pooled first token; the highest-scoring option is the answer. COPA trains that score with a softmax over
its two choices (multiple choice); ReCoRD, whose queries may have several right entities, trains each
entity's score on its own with a logistic loss ("the probability of each candidate independent of the
others", as the baseline did), and predicts the best-scoring one per query.
"""

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .finetune import build_classifier, collate, in_chunks, run_epochs


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


def option_logits(model, rows: list[list[int]], pad_id, device, autocast) -> torch.Tensor:
    with autocast():
        return model(**collate(rows, pad_id, device)).logits[:, 0].float()


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
class CandidateScoring:
    """A one-logit head over (context, option) pairs, trained with `loss`; the answer is the best option."""

    loss: object

    def __call__(self, checkpoint, tokenizer, task, recipe, seed, runtime, random_init, label, progress=None):
        torch.manual_seed(seed)
        train = encode_options(tokenizer, task.train, recipe.max_length)
        dev = {split: encode_options(tokenizer, rows, recipe.max_length) for split, rows in task.dev.items()}
        model = build_classifier(checkpoint, task, recipe.dropout, random_init).to(runtime.device)
        autocast, pad_id, device = runtime.autocast(), tokenizer.pad_token_id, runtime.device

        def batch_loss(batch):
            rows = [train[i] for i in batch]
            logits = option_logits(model, [r for options in rows for r in options], pad_id, device, autocast)
            return self.loss(logits, [len(options) for options in rows], [task.train[i].gold for i in batch])

        def predict(split):
            questions, picks = dev[split], []

            def forward(chunk):
                rows = [r for i in chunk for r in questions[i]]
                return option_logits(model, rows, pad_id, device, contextlib.nullcontext)

            for chunk, logits in in_chunks(len(questions), recipe.batch_size, autocast, forward):
                picks += [int(scores.argmax()) for scores in torch.split(logits, [len(questions[i]) for i in chunk])]
            return np.array(picks)

        lengths = [max(len(r) for r in options) * len(options) for options in train]
        return run_epochs(task, recipe, seed, runtime, model, lengths, batch_loss, predict, label, progress)

