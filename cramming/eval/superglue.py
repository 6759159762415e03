"""SuperGLUE tasks: one registered spec per task, read from the original release's folders or the hub.

Local files follow the original zips (one folder per task: train.jsonl, val.jsonl, test.jsonl; the diagnostics
AX-b/AX-b.jsonl and AX-g/AX-g.jsonl, test-only). Nested records (MultiRC's passage -> questions -> answers,
ReCoRD's passage -> qas) are flattened into the rows the hub dataset `aps/super_glue` serves, with the hub's
label indices, so one builder per task turns either source into examples. test.jsonl has no labels and is
not read. AX-b and AX-g are predicted by the RTE model (as the SuperGLUE baselines did): they are extra dev
splits of RTE.
"""

import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ..errors import UserError, check
from ..registry import Registry
from . import superglue_metrics as m
from .files import hub_rows, json_objects, require_files
from .tasks import Example, TaskData

HUB_DATASET = "aps/super_glue"


@dataclass
class Choice:
    """A question answered by picking among options (COPA's two choices, ReCoRD's entities): each option is
    scored as the pair (context, option); `gold` are the right options' indices."""

    context: str
    options: list[str]
    gold: list[int]
    names: list[str]  # what each option stands for (ReCoRD: the entity), for the metric
    answers: list[str] = field(default_factory=list)  # ReCoRD's gold answer texts


@dataclass
class SpanPair:
    """WSC: does the pronoun (span 2) refer to the noun phrase (span 1)? Spans are character ranges."""

    text: str
    span1: tuple[int, int]
    span2: tuple[int, int]
    label: int


@dataclass(frozen=True)
class SuperGlueTask:
    name: str
    folder: str  # in the original release
    hub_config: str
    labels: dict  # local raw label -> hub class index ({} where the hub's is the raw one)
    label_names: tuple[str, ...] | None  # classification heads; None: scored per option (COPA, ReCoRD)
    build: object  # [(flat row, where)] -> examples
    scorer: object  # (predictions, examples) -> metrics in percent, with "score"
    head: str = "classifier"  # a name in kinds.HEADS


@dataclass
class Grouped(Example):
    """A pair example that belongs to a group: MultiRC's question (for exact match), AX-g's sentence pair."""

    group: object = None


def _field(row: dict, key: str, where: str):
    if key not in row:
        raise UserError(f"{where}: missing field {key!r} (fields: {', '.join(row) or 'none'})")
    return row[key]


def _text(row: dict, key: str, where: str) -> str:
    """A text field of a row: a string (a number or a list someone wrote there is one line, not trained on)."""
    value = _field(row, key, where)
    if not isinstance(value, str):
        raise UserError(f"{where}: field {key!r} holds a {type(value).__name__}, not text")
    return value


def _pairs(first: str, second: str, rows):
    return [Example(_text(r, first, w), _text(r, second, w), r["label"]) for r, w in rows]


def _wic(rows):
    """The target word prefixes the first sentence ("word: sentence1"), so that the [CLS] head knows which word
    to compare; the baseline concatenated the word's representations to [CLS] instead."""
    return [Example(f"{_field(r, 'word', w)}: {_field(r, 'sentence1', w)}", str(_field(r, "sentence2", w)),
                    r["label"]) for r, w in rows]


def _multirc(rows):
    """One binary example per (paragraph, question + answer option); the question groups them for EM."""
    return [Grouped(str(_field(r, "paragraph", w)), f"{_field(r, 'question', w)} {_field(r, 'answer', w)}",
                    r["label"], (r["idx"]["paragraph"], r["idx"]["question"])) for r, w in rows]


def _axg(rows):
    """Each Winogender sentence comes twice, once per pronoun gender: `pair_id` where a row has one, else the
    release's order (idx 2k and 2k+1 are one pair)."""
    return [Grouped(str(_field(r, "premise", w)), str(_field(r, "hypothesis", w)), r["label"],
                    r.get("pair_id", int(_field(r, "idx", w)) // 2)) for r, w in rows]


CONNECTORS = {"cause": "because", "effect": "so"}


def _copa(rows):
    """The premise, its final stop dropped, runs on into a connector ("because" for a cause, "so" for an
    effect) and each choice completes it."""
    out = []
    for r, w in rows:
        question = _field(r, "question", w)
        if question not in CONNECTORS:
            raise UserError(f"{w}: question {question!r} is not one of cause, effect")
        options = [str(_field(r, "choice1", w)), str(_field(r, "choice2", w))]
        context = f"{str(_field(r, 'premise', w)).rstrip('.')} {CONNECTORS[question]}"
        out.append(Choice(context, options, [r["label"]], options))
    return out


def _record(rows):
    """Every entity of the passage, substituted for @placeholder in the query, is one option; those equal to a
    gold answer are gold (several may be). The passage's "@highlight" markers become dashes."""
    out = []
    for r, w in rows:
        query, entities = str(_field(r, "query", w)), list(_field(r, "entities", w))
        if "@placeholder" not in query:
            raise UserError(f"{w}: the query has no @placeholder")
        if not entities:
            raise UserError(f"{w}: the passage has no entities")
        answers = list(_field(r, "answers", w))
        passage = str(_field(r, "passage", w)).replace("@highlight\n", "- ")
        out.append(Choice(passage, [query.replace("@placeholder", e) for e in entities],
                          [i for i, e in enumerate(entities) if e in answers], entities, answers))
    return out


def _wsc(rows):
    return [SpanPair(str(_field(r, "text", w)), *[_word_span(r, k, w) for k in (1, 2)], r["label"]) for r, w in rows]


def _word_span(row: dict, k: int, where: str) -> tuple[int, int]:
    """WSC gives span k as the index of its first word in the whitespace-split text: a character range."""
    text, index, span_text = str(_field(row, "text", where)), _field(row, f"span{k}_index", where), \
        str(_field(row, f"span{k}_text", where))
    words, starts, position = text.split(), [], 0
    for word in words:
        position = text.index(word, position)
        starts.append(position)
        position += len(word)
    count = max(1, len(span_text.split()))
    if not isinstance(index, int) or not 0 <= index <= len(words) - count:
        raise UserError(f"{where}: span{k}_index {index!r} ({span_text!r}) is outside the text's {len(words)} words")
    last = index + count - 1
    return starts[index], starts[last] + len(words[last])


def _labels(scorer, predictions, examples):
    return scorer(predictions, [e.label for e in examples])


def _grouped(scorer, predictions, examples):
    """MultiRC's and AX-g's scorers also read each example's group (its question, its pronoun pair)."""
    return scorer(predictions, [e.label for e in examples], [e.group for e in examples])


def _score_copa(predictions, examples):
    return m.accuracy([int(p in e.gold) for p, e in zip(predictions, examples)], [1] * len(examples))


def _score_record(predictions, examples):
    return m.record_scores([e.names[p] for p, e in zip(predictions, examples)], [e.answers for e in examples])


SUPERGLUE_TASKS = Registry("SuperGLUE task")
_BOOL = {False: 0, True: 1}  # JSON true/false (and 0/1, equal to them in Python)
_NLI2 = ("entailment", "not_entailment")
_NLI2_INDEX = {"entailment": 0, "not_entailment": 1}
for _task in [
    SuperGlueTask("boolq", "BoolQ", "boolq", _BOOL, ("False", "True"), partial(_pairs, "question", "passage"),
                  partial(_labels, m.accuracy)),
    SuperGlueTask("cb", "CB", "cb", {"entailment": 0, "contradiction": 1, "neutral": 2},
                  ("entailment", "contradiction", "neutral"), partial(_pairs, "premise", "hypothesis"),
                  partial(_labels, m.cb_scores)),
    SuperGlueTask("copa", "COPA", "copa", _BOOL, None, _copa, _score_copa, head="choice"),
    SuperGlueTask("multirc", "MultiRC", "multirc", _BOOL, ("False", "True"), _multirc,
                  partial(_grouped, m.multirc_scores)),
    SuperGlueTask("record", "ReCoRD", "record", {}, None, _record, _score_record, head="candidates"),
    SuperGlueTask("rte", "RTE", "rte", _NLI2_INDEX, _NLI2, partial(_pairs, "premise", "hypothesis"),
                  partial(_labels, m.accuracy)),
    SuperGlueTask("wic", "WiC", "wic", _BOOL, ("False", "True"), _wic, partial(_labels, m.accuracy)),
    SuperGlueTask("wsc", "WSC", "wsc", _BOOL, ("False", "True"), _wsc, partial(_labels, m.accuracy),
                  head="span-pair"),
    SuperGlueTask("axb", "AX-b", "axb", _NLI2_INDEX, _NLI2, partial(_pairs, "sentence1", "sentence2"),
                  partial(_labels, m.axb_scores)),
    SuperGlueTask("axg", "AX-g", "axg", _NLI2_INDEX, _NLI2, _axg, partial(_grouped, m.axg_scores)),
]:
    SUPERGLUE_TASKS.register(_task.name)(_task)


def load_superglue_task(name: str, data_dir: str | None, diagnostics: tuple[str, ...] = ()) -> TaskData:
    """Train and dev of one task; for RTE, `diagnostics` (axb, axg) join as dev splits its model predicts."""
    spec = SUPERGLUE_TASKS.get_or_explain(name)
    specs = {"train": spec, "dev": spec} | {d: SUPERGLUE_TASKS.get_or_explain(d) for d in diagnostics}
    if data_dir is None:
        read, source = _read_hub, f"hub:{HUB_DATASET}/{spec.hub_config}"
    else:
        folder = Path(data_dir)
        read, source = partial(_read_local, folder), str(folder / spec.folder)
        for split, s in specs.items():  # every file checked before any is parsed: one run names the missing one
            _local_path(folder, s, split)
    examples = {}
    for split, s in specs.items():
        built = s.build(read(s, split))
        if not built:
            raise UserError(f"{s.name}: no {split} examples in {source}")
        examples[split] = built
    scorers = {split: s.scorer for split, s in specs.items()}
    return TaskData(spec.name, examples.pop("train"), examples, list(spec.label_names) if spec.label_names else None,
                    ["score"], "score", source, scorer=lambda split, p, rows: scorers[split](p, rows), head=spec.head)


def read(name: str, e) -> TaskData:
    """eval=superglue's reader: RTE's model predicts the diagnostics that eval.tasks lists."""
    return load_superglue_task(name, e.data_dir, tuple(d for d in m.DIAGNOSTICS if d in e.tasks) if name == "rte" else ())


def trained(e) -> list[str]:
    return [t for t in e.tasks if t not in m.DIAGNOSTICS]


def refuse(e) -> None:
    """A diagnostic is predicted by the RTE model: it needs rte among the tasks, and has no recipe of its own."""
    for diagnostic in m.DIAGNOSTICS:
        check(diagnostic not in e.tasks or "rte" in e.tasks, "eval.tasks", e.tasks,
              f"{diagnostic} is predicted by the RTE model: add rte to eval.tasks (or drop {diagnostic})")
        check(diagnostic not in e.per_task, f"eval.per_task.{diagnostic}", e.per_task.get(diagnostic),
              f"{diagnostic} is not fine-tuned (the RTE model predicts it): set eval.per_task.rte instead")


# ---------------------------------------------------------------- the original release's folders


def _local_path(folder: Path, spec: SuperGlueTask, split: str) -> Path:
    task_dir = folder / spec.folder
    if not task_dir.is_dir():
        raise UserError(f"{spec.name}: missing task folder {task_dir}; eval.data_dir must be a SuperGLUE folder with "
                        f"one subfolder per task ({', '.join(t.folder for t in SUPERGLUE_TASKS.values())})")
    path = task_dir / {"train": "train.jsonl", "dev": "val.jsonl"}.get(split, f"{spec.folder}.jsonl")
    require_files(spec.name, [path], "hold the original SuperGLUE files")
    return path


def _read_local(folder: Path, spec: SuperGlueTask, split: str) -> list[tuple[dict, str]]:
    """(flat row, where) per example, labels as the hub's class indices."""
    path = _local_path(folder, spec, split)
    rows = []
    for number, record in json_objects(path):
        where = f"{path} line {number}"
        try:
            flat = list(FLATTEN.get(spec.name, lambda r: [r])(record))
        except (KeyError, TypeError, IndexError) as err:
            raise UserError(f"{where}: malformed {spec.name} record ({type(err).__name__}: {err})") from None
        for row in flat:
            if spec.labels:
                raw = _field(row, "label", where)
                if isinstance(raw, list | dict) or raw not in spec.labels:
                    raise UserError(f"{where}: label {raw!r} is not one of "
                                    f"{', '.join(map(json.dumps, dict.fromkeys(spec.labels)))}")
                row["label"] = spec.labels[raw]
            rows.append((row, where))
    return rows


def _flatten_multirc(record: dict):
    passage = record["passage"]
    for question in passage["questions"]:
        for answer in question["answers"]:
            yield {"paragraph": passage["text"], "question": question["question"], "answer": answer["text"],
                   "label": answer["label"],
                   "idx": {"paragraph": record["idx"], "question": question["idx"], "answer": answer["idx"]}}


def _flatten_record(record: dict):
    """Entity offsets are inclusive at both ends in the release."""
    text = record["passage"]["text"]
    entities = sorted({text[e["start"]:e["end"] + 1] for e in record["passage"]["entities"]})
    for qa in record["qas"]:
        yield {"passage": text, "query": qa["query"], "entities": entities,
               "answers": sorted({a["text"] for a in qa.get("answers", [])}),
               "idx": {"passage": record["idx"], "query": qa["idx"]}}


def _flatten_wsc(record: dict):
    yield {**record, **record["target"]}


FLATTEN = {"multirc": _flatten_multirc, "record": _flatten_record, "wsc": _flatten_wsc}


# ---------------------------------------------------------------- hub


HUB_SPLITS = {"train": "train", "dev": "validation"}  # the diagnostics: their only split, "test"


def _read_hub(spec: SuperGlueTask, split: str) -> list[tuple[dict, str]]:
    """The task's split from `aps/super_glue` (or the datasets cache, offline), labels checked to be class indices."""
    rows = hub_rows(spec.name, HUB_DATASET, spec.hub_config, HUB_SPLITS.get(split, "test"),
                    "eval.data_dir=<SuperGLUE folder>")
    for row, where in rows:
        if spec.labels and _field(row, "label", where) not in set(spec.labels.values()):
            raise UserError(f"{where}: label {row['label']!r} is not a class index (unlabelled split?)")
    return rows
