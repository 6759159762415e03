"""GLUE task specs and loaders: one table row per task, one TSV reader for all of them.

Local files follow the original `glue_data/` layout (download_glue_data.py). They are read with quoting
off (sentences hold literal `"`), so every line is split on tabs and nothing else.
Without a local folder the same tasks come from the hub dataset `nyu-mll/glue`.
"""

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..hub import hub_dataset
from ..registry import Registry
from ..untrusted import text_lines
from .files import require_files

log = logging.getLogger(__name__)

HUB_DATASET = "nyu-mll/glue"


@dataclass
class Example:
    text_a: str
    text_b: str | None
    label: int | float  # class index, or float score for regression


@dataclass
class TaskData:
    name: str
    train: list[Example]
    dev: dict[str, list[Example]]  # MNLI: {"matched", "mismatched"}; the others {"dev"}
    label_names: list[str] | None  # None = regression
    metric_names: list[str]
    main_metric: str  # the one averaged into the GLUE score
    source: str  # where it was loaded from; QQP also says how many malformed rows were skipped
    scorer: Callable | None = None  # (split, predictions, dev examples) -> metrics; None: compute_metrics
    head: str = "classifier"  # what fine-tunes and reads it out: a name in kinds.HEADS (finetune.Head)
    columns: tuple[str, ...] = ()  # metrics shown as their own table columns <task>/<metric> (zero-shot's acc, acc_norm)


@dataclass(frozen=True)
class TaskSpec:
    """How one GLUE task is laid out locally and on the hub; label order is the hub's."""

    name: str
    folder: str
    text_columns: tuple[str, ...]  # header names in the TSV
    label_column: str
    raw_labels: tuple[str, ...] | None  # label strings in the TSV, in class-index order; None = float score
    label_names: tuple[str, ...] | None
    metric_names: tuple[str, ...]
    main_metric: str
    hub_columns: tuple[str, ...]
    dev_splits: tuple[tuple[str, str, str], ...] = (("dev", "dev.tsv", "validation"),)  # (split, local file, hub split)
    no_header: tuple[str, ...] | None = None  # column names for files without a header line (CoLA)
    skip_malformed: bool = False  # QQP: the original GLUE processors drop its few broken rows
    column: int = 0  # its place in the GLUE paper's table (results.COLUMNS)
    averaged: bool = True  # counted in the GLUE average and run by default (WNLI is not: eval.include_wnli)
    score_keys: tuple[str, ...] = ()  # one per dev split, as glue_average keys them; () = (name,)

    @property
    def keys(self) -> tuple[str, ...]:
        return self.score_keys or (self.name,)


GLUE_TASKS = Registry("GLUE task")
_NLI2 = ("entailment", "not_entailment")
_SPECS = [
    TaskSpec("cola", "CoLA", ("sentence",), "label", ("0", "1"), ("unacceptable", "acceptable"),
             ("matthews",), "matthews", ("sentence",), no_header=("source", "label", "mark", "sentence"), column=4),
    TaskSpec("sst2", "SST-2", ("sentence",), "label", ("0", "1"), ("negative", "positive"),
             ("accuracy",), "accuracy", ("sentence",), column=3),
    TaskSpec("mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", ("0", "1"), ("not_equivalent", "equivalent"),
             ("accuracy", "f1"), "f1", ("sentence1", "sentence2"), column=6),
    TaskSpec("qqp", "QQP", ("question1", "question2"), "is_duplicate", ("0", "1"), ("not_duplicate", "duplicate"),
             ("accuracy", "f1"), "f1", ("question1", "question2"), skip_malformed=True, column=1),
    TaskSpec("stsb", "STS-B", ("sentence1", "sentence2"), "score", None, None,
             ("pearson", "spearman"), "pearson", ("sentence1", "sentence2"), column=5),
    TaskSpec("mnli", "MNLI", ("sentence1", "sentence2"), "gold_label", ("entailment", "neutral", "contradiction"),
             ("entailment", "neutral", "contradiction"), ("accuracy",), "accuracy", ("premise", "hypothesis"),
             dev_splits=(("matched", "dev_matched.tsv", "validation_matched"),
                         ("mismatched", "dev_mismatched.tsv", "validation_mismatched")),
             score_keys=("mnli-m", "mnli-mm"), column=0),
    TaskSpec("qnli", "QNLI", ("question", "sentence"), "label", _NLI2, _NLI2,
             ("accuracy",), "accuracy", ("question", "sentence"), column=2),
    TaskSpec("rte", "RTE", ("sentence1", "sentence2"), "label", _NLI2, _NLI2,
             ("accuracy",), "accuracy", ("sentence1", "sentence2"), column=7),
    TaskSpec("wnli", "WNLI", ("sentence1", "sentence2"), "label", ("0", "1"), ("not_entailment", "entailment"),
             ("accuracy",), "accuracy", ("sentence1", "sentence2"), column=8, averaged=False),
]
for _spec in _SPECS:
    GLUE_TASKS.register(_spec.name)(_spec)
# Everything else about the GLUE tasks derives from the table above: the default eval.tasks and the average's tasks,
# glue_average's score keys, and the results table's columns (titles from the folders, in the paper's order).
GLUE_SET = tuple(spec.name for spec in _SPECS if spec.averaged)
GLUE_KEYS = tuple(key for spec in _SPECS for key in spec.keys)
GLUE_COLUMNS = [(spec.folder + key.removeprefix(spec.name), key)
                for spec in sorted(_SPECS, key=lambda spec: spec.column) for key in spec.keys]


def load_task(name: str, data_dir: str | None) -> TaskData:
    """Train and dev examples of one GLUE task, from a local `glue_data/` folder or (None) the hub."""
    try:
        spec = GLUE_TASKS.get_or_explain(name)
    except ValueError as err:
        raise UserError(str(err)) from None
    if data_dir is None:
        train, dev, source = _load_hub(spec)
    else:
        train, dev, source = _load_local(spec, Path(data_dir))
    return TaskData(spec.name, train, dev, list(spec.label_names) if spec.label_names else None,
                    list(spec.metric_names), spec.main_metric, source)


# ---------------------------------------------------------------- local glue_data/ folder


def _load_local(spec: TaskSpec, data_dir: Path):
    folder = data_dir / spec.folder
    if not folder.is_dir():
        raise UserError(f"{spec.name}: missing task folder {folder}; eval.data_dir must be a glue_data/ folder "
                        f"with one subfolder per task ({', '.join(s.folder for s in _SPECS)})")
    files = {"train": folder / "train.tsv"} | {split: folder / f for split, f, _ in spec.dev_splits}
    require_files(spec.name, files.values(), "hold the original glue_data/ files")
    skipped = {}
    loaded = {}
    for split, path in files.items():
        loaded[split], skipped[path.name] = _read_tsv(spec, path)
    source = str(folder)
    if spec.skip_malformed:
        total = sum(skipped.values())
        source += f" (skipped {total} malformed row{'s' * (total != 1)}: " + \
            ", ".join(f"{name} {n}" for name, n in skipped.items()) + ")"
        if total:
            log.warning("%s: skipped %d malformed rows, as the original GLUE processors do", spec.name, total)
    train = loaded.pop("train")
    return train, loaded, source


def _lines(path: Path):
    """(1-based line number, fields) per non-empty line; BOM stripped, only '\\n' ends a line; a line that is not
    UTF-8 or is longer than any sentence (untrusted.text_lines) is one line naming it."""
    for number, line in enumerate(text_lines(path), start=1):
        line = line.rstrip("\n").removesuffix("\r")
        if line:
            yield number, line.split("\t")


def _read_tsv(spec: TaskSpec, path: Path) -> tuple[list[Example], int]:
    """Examples of one file and the number of malformed rows skipped (QQP only; elsewhere they are errors)."""
    rows = _lines(path)
    if spec.no_header:
        header = list(spec.no_header)
    else:
        _, header = next(rows, (0, []))
    missing = [c for c in (*spec.text_columns, spec.label_column) if c not in header]
    if missing:
        raise UserError(f"{path}: header lacks column(s) {', '.join(map(repr, missing))} "
                        f"(header: {', '.join(header) or 'empty file'})")
    text_idx = [header.index(c) for c in spec.text_columns]
    label_idx = header.index(spec.label_column)
    examples, skipped = [], 0
    for number, fields in rows:
        problem, texts = None, []
        if len(fields) != len(header):
            problem = f"{len(fields)} fields, expected {len(header)}"
        else:
            texts = [fields[i].strip() for i in text_idx]
            if not all(texts):
                problem = f"empty text in column {spec.text_columns[texts.index('')]!r}"
        if problem and spec.skip_malformed:
            skipped += 1
            continue
        if problem:
            raise UserError(f"{path} line {number}: malformed row ({problem})")
        label = _parse_label(spec, fields[label_idx].strip(), path, number)
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label))
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples, skipped


def _parse_label(spec: TaskSpec, raw: str, path: Path, number: int) -> int | float:
    if spec.raw_labels is None:
        try:
            score = float(raw)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise UserError(f"{path} line {number}: malformed row (score {raw!r} is not a number)")
        return score
    if raw not in spec.raw_labels:
        raise UserError(f"{path} line {number}: label {raw!r} is not one of {', '.join(spec.raw_labels)}")
    return spec.raw_labels.index(raw)


# ---------------------------------------------------------------- hub


def _load_hub(spec: TaskSpec):
    """`nyu-mll/glue` from the hub (or the datasets cache, offline)."""
    splits = hub_dataset(spec.name, HUB_DATASET, spec.name, fix="eval.data_dir=<glue_data folder>")
    hub_splits = {"train": "train"} | {split: hub for split, _, hub in spec.dev_splits}
    loaded = {split: _hub_examples(spec, splits[hub]) for split, hub in hub_splits.items()}
    train = loaded.pop("train")
    return train, loaded, f"hub:{HUB_DATASET}/{spec.name}"


def _hub_examples(spec: TaskSpec, dataset) -> list[Example]:
    texts = [list(dataset[c]) for c in spec.hub_columns]
    labels = list(dataset["label"])
    cast = float if spec.raw_labels is None else int
    second = texts[1] if len(texts) > 1 else [None] * len(labels)
    return [Example(a, b, cast(y)) for a, b, y in zip(texts[0], second, labels)]
