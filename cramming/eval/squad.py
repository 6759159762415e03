"""eval=squad: extractive question answering on SQuAD v1.1 (task `squad`) and v2.0 (`squad_v2`).

The model is the checkpoint's AutoModelForQuestionAnswering (a start and an end score per token; ours is
model/heads.py), fine-tuned by finetune.run_epochs like every other head and scored with the official metrics
(squad_metrics.py) after each epoch. The last epoch's answers ({id: text}, the official scripts' input) go back
with the run, and the recipe writes them beside results.json.

A context longer than the window is cut into overlapping windows (the fast tokenizer's overflowing tokens,
`doc_stride` tokens shared by neighbours, as Hugging Face's run_qa reads it), each holding the (cut) question
first. A training window is labelled with the token positions of the answer when it holds the whole answer, else
with position 0 (the [CLS] token of a BERT-style tokenizer): "no answer here", as BERT's run_squad did.
Prediction looks at every window of a question: the best valid span (inside the context, end not before start,
at most max_answer_length tokens) over the n_best start and end candidates, read back through the character
offsets; SQuAD v2.0 answers nothing when the null score (start[0] + end[0], the lowest over the windows) beats
that span by more than null_threshold.
"""

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import AutoModelForQuestionAnswering

from ..errors import UserError, check
from ..model.modeling_crammed import BLOCKS
from ..model.positions import POSITIONS
from .config import recipe_for
from .finetune import Head, auto_model, require_fast
from .squad_data import SquadOptions, load_squad_examples
from .squad_metrics import squad_scores
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
                     main_metric="f1", source=source, head="squad",
                     scorer=lambda split, answers, examples: squad_scores(answers, examples, spec.version),
                     version=spec.version, options=e.squad)


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


# ---------------------------------------------------------------- windows and answers


@dataclass
class Window:
    ids: list[int]
    example: int  # index of its question in the examples
    offsets: list[tuple[int, int] | None]  # per token: its characters in the context, None outside the context
    start: int = 0  # label: the answer's first token, 0 when this window does not hold the answer
    end: int = 0


def cut_question(tokenizer, question: str, max_query_length: int) -> str:
    """The question's text up to its max_query_length-th token (leading blanks dropped: a few SQuAD questions
    start with many, which would only take window room)."""
    question = question.lstrip()
    offsets = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return question[:offsets[max_query_length - 1][1]] if len(offsets) > max_query_length else question


def encode_windows(tokenizer, examples, max_length: int, options) -> list[Window]:
    """Every window of every example, labelled with the first answer's tokens (training reads those)."""
    require_fast(tokenizer, "eval=squad", "character offsets")
    questions = [cut_question(tokenizer, e.question, options.max_query_length) for e in examples]
    try:
        encoded = tokenizer(questions, [e.context for e in examples], truncation="only_second", max_length=max_length,
                            stride=options.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    except Exception as err:  # noqa: BLE001  a stride leaving no room: ValueError (transformers), Exception (Rust)
        raise UserError(f"eval.squad.doc_stride={options.doc_stride} with eval.recipe.max_length={max_length} and "
                        f"eval.squad.max_query_length={options.max_query_length}: no room for the context "
                        f"({str(err).splitlines()[0][:120]}); lower doc_stride or raise max_length") from None
    windows = []
    for w, example in enumerate(encoded["overflow_to_sample_mapping"]):
        sequence = encoded.sequence_ids(w)
        offsets = [tuple(o) if s == 1 else None for o, s in zip(encoded["offset_mapping"][w], sequence)]
        window = Window(encoded["input_ids"][w], example, offsets)
        if examples[example].answers:
            window.start, window.end = answer_tokens(offsets, *examples[example].answers[0])
        windows.append(window)
    return windows


def answer_tokens(offsets, text: str, char_start: int) -> tuple[int, int]:
    """(first, last) token of the answer's characters in this window, or (0, 0) when the window lacks any of them."""
    char_end = char_start + len(text)
    inside = [i for i, o in enumerate(offsets) if o is not None]
    if not inside or offsets[inside[0]][0] > char_start or offsets[inside[-1]][1] < char_end:
        return 0, 0
    first = max(i for i in inside if offsets[i][0] <= char_start)
    last = min(i for i in inside if offsets[i][1] >= char_end)
    return first, last


def best_span(offsets, start_logits, end_logits, n_best: int, max_answer_length: int):
    """(score, char_start, char_end) of the best valid span in one window, or None when none is valid."""
    length = len(offsets)
    starts = np.argsort(start_logits[:length])[::-1][:n_best]
    ends = np.argsort(end_logits[:length])[::-1][:n_best]
    best = None
    for i in starts:
        if offsets[i] is None:
            continue
        for j in ends:
            if offsets[j] is None or j < i or j - i + 1 > max_answer_length:
                continue
            score = float(start_logits[i] + end_logits[j])
            if best is None or score > best[0]:
                best = (score, offsets[i][0], offsets[j][1])
    return best


def decode_answers(examples, windows, start_logits, end_logits, options, version: int) -> dict[str, str]:
    """{question id: predicted text} from every window's logits (lists of 1-d arrays, one per window)."""
    per_example: dict[int, list[int]] = {}
    for w, window in enumerate(windows):
        per_example.setdefault(window.example, []).append(w)
    answers = {}
    for index, example in enumerate(examples):
        best, null = None, None
        for w in per_example.get(index, []):
            span = best_span(windows[w].offsets, start_logits[w], end_logits[w], options.n_best,
                             options.max_answer_length)
            if span is not None and (best is None or span[0] > best[0]):
                best = span
            score = float(start_logits[w][0] + end_logits[w][0])
            null = score if null is None else min(null, score)
        text = "" if best is None else example.context[best[1]:best[2]]
        if version == 2 and (best is None or null - best[0] > options.null_threshold):
            text = ""
        answers[example.id] = text
    return answers


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
