"""The user's own task: one or two text fields and a label, from CSV, TSV or JSONL files.

It goes through the same fine-tuning and metrics as a GLUE task, so it is returned as a TaskData.
"""

import csv
import math
from pathlib import Path

from ..errors import UserError, check, check_choice
from ..untrusted import text_lines
from .files import files_source, json_objects
from .tasks import Example, TaskData

TASK_TYPES = ("classification", "regression")


MAX_CLASSES = 10_000


def load_custom_task(train_file: str, dev_file: str, text_fields: list[str], label_field: str,
                     task_type: str | None = None) -> TaskData:
    """Load train and dev; `task_type` None infers it: all labels numeric and some not whole -> regression."""
    if task_type is not None and task_type not in TASK_TYPES:
        raise UserError(f"custom task type {task_type!r} is not one of {', '.join(TASK_TYPES)} (or null to infer)")
    text_fields = list(text_fields)
    if not 1 <= len(text_fields) <= 2:
        raise UserError(f"a custom task takes one or two text fields, got {len(text_fields)}: {text_fields}")
    train = _read_rows(Path(train_file), text_fields, label_field)
    dev = _read_rows(Path(dev_file), text_fields, label_field)
    if task_type is None:
        numbers = [_as_number(raw) for _, _, raw in train]
        fractional = all(x is not None for x in numbers) and any(x != int(x) for x in numbers)
        task_type = "regression" if fractional else "classification"
    if task_type == "regression":
        return TaskData("custom", _scores(train, train_file), {"dev": _scores(dev, dev_file)}, None,
                        ["pearson", "spearman"], "pearson", files_source(train_file, dev_file))
    label_names = _label_names([raw for _, _, raw in train])
    if len(label_names) < 2:
        raise UserError(f"{train_file}: a classification task needs at least two labels, found {label_names}")
    if len(label_names) > MAX_CLASSES:  # the head would hold hidden x classes weights (and their optimizer state)
        raise UserError(f"{train_file}: {len(label_names):,} distinct labels, more than the {MAX_CLASSES:,} classes a "
                        "sequence classifier here takes; numbers are a regression (eval.task_type=regression)")
    index = {name: i for i, name in enumerate(label_names)}
    metrics = ["accuracy", "f1", "matthews"] if len(label_names) == 2 else ["accuracy", "matthews"]
    return TaskData("custom", _classes(train, index, train_file), {"dev": _classes(dev, index, dev_file)},
                    label_names, metrics, "accuracy", files_source(train_file, dev_file))


def read(name: str, e) -> TaskData:
    return load_custom_task(e.train_file, e.dev_file, list(e.text_fields), e.label_field, e.task_type)


def refuse(e) -> None:
    check(bool(e.train_file and e.dev_file), "eval.train_file", e.train_file,
          "eval=custom needs eval.train_file and eval.dev_file")
    check(1 <= len(e.text_fields) <= 2, "eval.text_fields", e.text_fields, "give one or two text fields")
    if e.task_type is not None:
        check_choice("eval.task_type", e.task_type, TASK_TYPES)


def _read_rows(path: Path, text_fields: list[str], label_field: str) -> list[tuple[int, list[str], object]]:
    """(line number, texts, raw label) per row; the format comes from the suffix."""
    if not path.is_file():
        raise UserError(f"custom task: missing file {path}")
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".tsv", ".jsonl"):
        raise UserError(f"{path}: custom task files must end in .csv, .tsv or .jsonl")
    wanted = [*text_fields, label_field]
    rows = []
    for number, record in (json_objects(path) if suffix == ".jsonl" else _table(path, suffix, wanted)):
        missing = [f for f in wanted if record.get(f) is None]
        if missing:
            raise UserError(f"{path} line {number}: missing field(s) {', '.join(missing)}")
        if bad := next((f for f in wanted if not isinstance(record[f], str | int | float)), None):
            raise UserError(f"{path} line {number}: field {bad!r} holds a {type(record[bad]).__name__}, not text or a "
                            "number")
        texts = [str(record[f]).strip() for f in text_fields]
        if not all(texts):
            raise UserError(f"{path} line {number}: empty text in field {text_fields[texts.index('')]!r}")
        rows.append((number, texts, record[label_field]))
    if not rows:
        raise UserError(f"{path}: no examples")
    return rows


def _table(path: Path, suffix: str, wanted: list[str]):
    """CSV (standard quoting) or TSV (quoting off, like the GLUE files); a header line is required."""
    lines = text_lines(path)  # UTF-8, each line bounded: one line naming the place otherwise
    reader = csv.reader(lines) if suffix == ".csv" else csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        header = next(reader, [])
        missing = [w for w in wanted if w not in header]
        if missing:
            raise UserError(f"{path}: header lacks field(s) {', '.join(missing)} (header: {', '.join(header) or 'empty'})")
        for fields in reader:
            if not any(fields):
                continue
            if len(fields) != len(header):
                raise UserError(f"{path} line {reader.line_num}: malformed row ({len(fields)} fields, expected {len(header)})")
            yield reader.line_num, dict(zip(header, fields))
    except csv.Error as err:
        raise UserError(f"{path} line {reader.line_num}: not valid {suffix[1:].upper()} ({err})") from None


def _as_number(raw) -> float | None:
    if isinstance(raw, bool):
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _label_key(raw) -> str:
    """One spelling per label, so that 1, "1" and "1.0" are the same class across files and formats."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    number = _as_number(raw)
    if number is not None and number == int(number):
        return str(int(number))
    return str(raw).strip()


def _label_names(raws: list) -> list[str]:
    """Sorted unique labels: numerically when all are whole numbers (so 0..k-1 keep their index)."""
    names = {_label_key(raw) for raw in raws}
    numeric = all(_as_number(n) is not None for n in names)
    return sorted(names, key=float) if numeric else sorted(names)


def _classes(rows, index: dict[str, int], path) -> list[Example]:
    examples = []
    for number, texts, raw in rows:
        key = _label_key(raw)
        if key not in index:
            listed = ", ".join(list(index)[:10]) + (f", ... ({len(index):,} in all)" if len(index) > 10 else "")
            raise UserError(f"{path} line {number}: label {key[:100]!r} does not occur in the train file "
                            f"(train labels: {listed})")
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, index[key]))
    return examples


def _scores(rows, path) -> list[Example]:
    examples = []
    for number, texts, raw in rows:
        score = _as_number(raw)
        if score is None:
            raise UserError(f"{path} line {number}: label {raw!r} is not a number (the task is a regression)")
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, score))
    return examples
