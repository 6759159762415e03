"""eval's one prediction loop (finetune.predict): every item predicted once, each prediction landing on its own
item whatever the chunking and the length sort, for the sequence classifier and the token tagger alike; and the
Head protocol every head fills, with its default loss."""

import contextlib
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cramming.eval.classifier_head import Classifier, Row
from cramming.eval.finetune import PREDICT_BATCHES, predict
from cramming.eval.token_head import Tagger, Words

LABELS = 3


class RowModel(torch.nn.Module):
    """Logits that name each row: its class is the sum of its ids mod LABELS (padding adds nothing), and each
    token's class (token_logits) its own id mod LABELS."""

    def forward(self, input_ids, attention_mask):
        sums = (input_ids * attention_mask).sum(-1)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(sums % LABELS, LABELS).float(),
                               token_logits=torch.nn.functional.one_hot(input_ids % LABELS, LABELS).float())


def rows(count: int = 37, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))] for _ in range(count)]


def test_every_item_is_predicted_once_in_chunks_of_the_predict_batches():
    """Chunks of PREDICT_BATCHES training batches (the last one shorter), shortest rows first, every row once."""
    ids = rows()
    seen = []

    class Recorder(RowModel):
        def forward(self, input_ids, attention_mask):
            seen.append(attention_mask.sum(-1).tolist())  # each row's length, in the chunk's order
            return super().forward(input_ids, attention_mask)

    task = SimpleNamespace(label_names=[str(k) for k in range(LABELS)])
    predict(Classifier(), Recorder(), [Row(row, 0) for row in ids], task, 2, 0, "cpu", contextlib.nullcontext)
    assert [len(chunk) for chunk in seen[:-1]] == [2 * PREDICT_BATCHES] * (len(seen) - 1)
    lengths = [n for chunk in seen for n in chunk]
    assert lengths == sorted(len(row) for row in ids)  # each row once, shortest first: a chunk pads little


def test_the_classifier_predicts_each_row_its_own_label():
    ids = rows()
    task = SimpleNamespace(label_names=[str(k) for k in range(LABELS)])
    items = [Row(row, 0) for row in ids]
    classes = predict(Classifier(), RowModel(), items, task, 2, 0, "cpu", contextlib.nullcontext)
    np.testing.assert_array_equal(classes, [sum(r) % LABELS for r in ids])


def test_the_tagger_tags_each_words_first_piece():
    ids = rows(seed=1)
    firsts = [[p for p in range(len(r)) if p % 2 == 0] + [-1] for r in ids]  # a last word without a piece: O
    labels = ["O", "B-X", "I-X"]

    class TagModel(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return SimpleNamespace(logits=RowModel()(input_ids, attention_mask).token_logits)

    items = [Words(row, [], first) for row, first in zip(ids, firsts)]
    tags = predict(Tagger(), TagModel(), items, SimpleNamespace(label_names=labels), 2, 0, "cpu",
                   contextlib.nullcontext)
    assert tags == [[labels[r[p] % LABELS] if p >= 0 else "O" for p in f] for r, f in zip(ids, firsts)]


def test_every_head_fills_the_protocol_or_says_it_trains_nothing():
    """A registered head either trains (each of Head's required methods its own, not the protocol's empty one) or
    is a function with the `untrained` trait: finetune() and run_task() can run every one. length and collate
    have a default, for items that are one row of ids; loss one, the model's own against each item's label."""
    from cramming.eval.finetune import Head
    from cramming.eval.kinds import HEADS

    required = ("build", "encode", "decode")
    for name, head in HEADS.items():
        if HEADS.trait(head, "untrained"):
            assert callable(head), name
            continue
        assert Head in type(head).__mro__, name  # declared as one: it inherits max_length, answers, record
        missing = [m for m in required if getattr(type(head), m) is getattr(Head, m)]
        assert missing == [], (name, missing)


@pytest.mark.parametrize("labels", [[0, 2, 1, 2], [0.5, -1.0, 2.0, 0.25]], ids=["classes", "regression"])
def test_a_heads_default_loss_is_cross_entropy_or_mse_against_each_items_label(labels):
    """The classifier and the multiple-choice head train on the Head protocol's default loss: the model's own
    against each item's label, which for a sequence classifier is cross-entropy over its classes, or mean squared
    error on its one output for a task without label names (STS-B); for multiple choice, cross-entropy over the
    question's choices."""
    from cramming.eval.multiple_choice_head import MultipleChoice, Question
    from cramming.model import CrammedConfig, CrammedForMultipleChoice, CrammedForSequenceClassification

    torch.manual_seed(0)
    tiny = {"vocab_size": 50, "hidden_size": 32, "num_layers": 1, "num_heads": 4, "ffn_size": 64,
            "max_seq_length": 16}
    regression = isinstance(labels[0], float)
    model = CrammedForSequenceClassification(CrammedConfig(**tiny, num_labels=1 if regression else 3,
                                                           problem_type="regression" if regression else None)).eval()
    items = [Row(ids, label) for ids, label in zip(rows(4), labels)]
    inputs = Classifier().collate(items, 0, "cpu")
    logits, target = model(**inputs).logits, torch.tensor(labels)
    expected = (torch.nn.functional.mse_loss(logits[:, 0], target) if regression
                else torch.nn.functional.cross_entropy(logits, target))
    torch.testing.assert_close(Classifier().loss(model, inputs, items), expected)
    if regression:
        return
    chooser, head = CrammedForMultipleChoice(CrammedConfig(**tiny)).eval(), MultipleChoice()  # no dropout
    questions = [Question([ids, ids[::-1], [7, *ids]], label) for ids, label in zip(rows(4), labels)]
    inputs = head.collate(questions, 0, "cpu")
    expected = torch.nn.functional.cross_entropy(chooser(**inputs).logits, torch.tensor(labels))
    torch.testing.assert_close(head.loss(chooser, inputs, questions), expected)
