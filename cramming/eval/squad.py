"""eval=squad: extractive question answering on SQuAD v1.1 (task `squad`) and v2.0 (`squad_v2`).

The model is the checkpoint's AutoModelForQuestionAnswering (a start and an end score per token; ours is
model/heads.py), trained on the windows of squad_windows.py by finetune.run_epochs like every other head, and
scored with the official metrics (squad_metrics.py) after each epoch. The last epoch's answers ({id: text}, the
official scripts' input) go back with the run, and the recipe writes them beside results.json.
"""

from dataclasses import dataclass, field
from functools import partial

import torch
from transformers import AutoModelForQuestionAnswering

from ..errors import UserError, check
from ..model.block import BLOCKS
from ..model.positions import POSITIONS
from .config import recipe_for
from .finetune import Head, auto_model
from .squad_data import SquadOptions, load_squad_examples
from .squad_metrics import squad_scores
from .squad_windows import decode_answers, encode_windows
from .tasks import TaskData

SPECIAL_TOKENS = 4  # the most a pair template adds (RoBERTa's <s> q </s></s> c </s>): room left for the context


@dataclass
class SquadTask(TaskData):
    """A SQuAD task: its examples are SquadExample, its options eval.squad."""

    version: int = 1
    options: SquadOptions = field(default_factory=SquadOptions)


def load_squad_task(name: str, e) -> SquadTask:
    spec, train, dev, source = load_squad_examples(name, e.data_dir)
    metrics = ["exact", "f1"] + (["HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"] if spec.version == 2 else [])
    return SquadTask(name=spec.name, train=train, dev={"dev": dev}, label_names=None, metric_names=metrics,
                     main_metric="f1", source=source, scorer=partial(_score, spec.version), head="squad",
                     version=spec.version, options=e.squad)


def _score(version: int, split, predictions: dict, examples) -> dict:
    return squad_scores(predictions, examples, version)


def build_qa_model(checkpoint: str, dropout: float, random_init: bool, max_length: int):
    return auto_model(AutoModelForQuestionAnswering, checkpoint, random_init, dropout,
                      fit=lambda config: fit_length(config, max_length))


def fit_length(config, max_length: int) -> None:
    """Grow a crammed model's computed position table (sinusoids) to max_length: SQuAD's 384 tokens on a checkpoint
    pretrained at 128. A learned table (the scheme's `learned_table`) or a block's sequence-sized weights (gMLP's
    spatial matrix: `fixed_length`) are weights of that size and cannot grow."""
    limit = config.max_seq_length
    if max_length <= limit:
        return
    layout = config.layout if isinstance(config.layout, list) else [config.layout]
    fixed = [f"{config.position} position table"] if POSITIONS.trait(config.position, "learned_table") else []
    fixed += [f"{kind} blocks' sequence-sized weights" for kind in dict.fromkeys(layout)
              if BLOCKS.trait(kind, "fixed_length")]
    if fixed:
        what = " and ".join(fixed)
        raise UserError(f"eval.recipe.max_length={max_length} is longer than this checkpoint's {what} "
                        f"(max_seq_length={limit}); set eval.recipe.max_length={limit} and eval.squad.doc_stride "
                        "below it minus max_query_length minus 4")
    config.max_seq_length = max_length


class Squad(Head):
    """Start and end logits per window; the best span over a question's windows is its answer. A run's record adds
    `predictions` ({split: {id: text}}, the last epoch's) and the number of training windows (the progress bar
    counts questions; windows are what is trained)."""

    def build(self, checkpoint, task, recipe, random_init):
        return build_qa_model(checkpoint, recipe.dropout, random_init, recipe.max_length)

    def encode(self, tokenizer, task, rows, max_length):
        return encode_windows(tokenizer, rows, max_length, task.options)

    def loss(self, model, inputs, items):
        device = inputs["input_ids"].device
        starts = torch.tensor([w.start for w in items], device=device)
        ends = torch.tensor([w.end for w in items], device=device)
        return model(**inputs, start_positions=starts, end_positions=ends).loss

    def decode(self, outputs, items, task):
        return [(outputs.start_logits[k, :len(w.ids)].float().cpu().numpy(),
                 outputs.end_logits[k, :len(w.ids)].float().cpu().numpy()) for k, w in enumerate(items)]

    def answers(self, task, split, items, predictions):
        starts, ends = zip(*predictions) if predictions else ((), ())
        return decode_answers(task.dev[split], items, list(starts), list(ends), task.options, task.version)

    def record(self, train, dev, answers):
        return {"train_windows": len(train), "predictions": answers}


def refuse(e) -> None:
    """Each window must leave its context room to move on: doc_stride below what the question and specials leave."""
    s = e.squad
    for task in e.tasks:
        room = recipe_for(e, task).max_length - s.max_query_length - SPECIAL_TOKENS
        check(s.doc_stride < room, "eval.squad.doc_stride", s.doc_stride,
              f"must be below max_length - max_query_length - {SPECIAL_TOKENS} = {room} (the context's room in "
              f"a window of {task}); lower it or eval.squad.max_query_length, or raise eval.recipe.max_length")
