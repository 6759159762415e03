"""SWAG and RACE: fine-tuned multiple choice (eval=swag, eval=race), read from the original releases or the hub.

SWAG (Zellers et al. 2018): swagaf's data/train.csv and val.csv; the context is `sent1`, each choice `sent2` and an
ending (as Hugging Face's run_swag). RACE (Lai et al. 2017): RACE/{train,dev}/{high,middle}/*.txt, one JSON object
per article; each question's choices are the question with the option filling its blank ("_"), or followed by the
option, against the article (as the RACE BERT baselines). Bad data stops the run with one line naming file and line,
before any training. Both score accuracy on the dev split (SWAG's val, RACE's dev; the test sets are not read).
"""

import csv
import re
from pathlib import Path

from ..errors import UserError, check
from ..untrusted import DATA_FILE_LIMIT, read_json, text_lines
from .files import hub_rows, require_files
from .multiple_choice_head import ChoiceExample
from .tasks import TaskData

SWAG_HUB, SWAG_CONFIG = "allenai/swag", "regular"
RACE_HUB = "ehovy/race"
ENDINGS = tuple(f"ending{i}" for i in range(4))
SWAG_COLUMNS = ("sent1", "sent2", *ENDINGS, "label")
LETTERS = "ABCD"
LEVELS = ("high", "middle")
RACE_TASKS = {"race": LEVELS, "race-high": ("high",), "race-middle": ("middle",)}  # eval.tasks -> levels trained


def _task(name: str, train: list, dev: dict, source: str) -> TaskData:
    return TaskData(name, train, dev, label_names=list(LETTERS), metric_names=["accuracy"], main_metric="accuracy",
                    source=source, head="multiple-choice")


# ---------------------------------------------------------------- SWAG


def swag_example(row: dict, where: str) -> ChoiceExample:
    """One SWAG row (a CSV row or a hub row): four non-empty endings and a label 0..3."""
    empty = [k for k in ENDINGS if not str(row.get(k) or "").strip()]
    if empty:
        raise UserError(f"{where}: {', '.join(empty)} empty (a SWAG row needs four endings)")
    label = str(row.get("label", "")).strip()
    if label not in ("0", "1", "2", "3"):
        raise UserError(f"{where}: label {label!r} is not one of 0, 1, 2, 3")
    start = str(row.get("sent2") or "").strip()
    return ChoiceExample(str(row.get("sent1") or "").strip(),
                         [f"{start} {str(row[k]).strip()}".strip() for k in ENDINGS], int(label))


def read_swag_csv(path: Path) -> list[ChoiceExample]:
    """Rows of a SWAG CSV (quoted fields may span lines: `line` is where a row starts)."""
    reader = csv.reader(text_lines(path))  # UTF-8, each line bounded
    try:
        return swag_rows(path, reader)
    except csv.Error as err:
        raise UserError(f"{path} line {reader.line_num}: not valid CSV ({err})") from None


def swag_rows(path: Path, reader) -> list[ChoiceExample]:
    header = next(reader, [])
    missing = [c for c in SWAG_COLUMNS if c not in header]
    if missing:
        raise UserError(f"{path} line 1: header lacks column(s) {', '.join(missing)} "
                        f"(header: {','.join(header) or 'empty file'})")
    examples, line = [], reader.line_num + 1
    for fields in reader:
        if fields:
            where = f"{path} line {line}"
            if len(fields) != len(header):
                raise UserError(f"{where}: {len(fields)} fields, expected {len(header)} (a SWAG row needs "
                                "four endings)")
            examples.append(swag_example(dict(zip(header, fields)), where))
        line = reader.line_num + 1
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples


def load_swag(data_dir: str | None) -> TaskData:
    if data_dir is None:
        splits = {s: hub_rows("swag", SWAG_HUB, SWAG_CONFIG, hub, "eval.data_dir=<folder with train.csv, val.csv>")
                  for s, hub in (("train", "train"), ("dev", "validation"))}
        examples = {s: [swag_example(row, where) for row, where in rows] for s, rows in splits.items()}
        return _task("swag", examples["train"], {"dev": examples["dev"]}, f"hub:{SWAG_HUB}/{SWAG_CONFIG}")
    folder = Path(data_dir)
    files = {"train": folder / "train.csv", "dev": folder / "val.csv"}
    require_files("swag", files.values(), "be SWAG's data/ folder (train.csv, val.csv)")
    return _task("swag", read_swag_csv(files["train"]), {"dev": read_swag_csv(files["dev"])}, str(folder))


# ---------------------------------------------------------------- RACE


def fill_blank(question: str, option: str) -> str:
    """The question with the option in its blank (a run of underscores), else the question then the option."""
    if "_" in question:
        return re.sub(r"_+", lambda _: option, question).strip()
    return f"{question.strip()} {option.strip()}".strip()


def race_question(article: str, question, options, answer, level: str, where: str) -> ChoiceExample:
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise UserError(f"{where}: options {options!r:.200} is not a list of 4 strings")
    if not isinstance(question, str):
        raise UserError(f"{where}: the question holds a {type(question).__name__}, not text")
    if len(options) != 4:
        raise UserError(f"{where}: {len(options)} options, expected 4")
    if answer not in tuple(LETTERS):
        raise UserError(f"{where}: answer {answer!r} is not one of A, B, C, D")
    return ChoiceExample(article, [fill_blank(str(question), str(o)) for o in options], LETTERS.index(answer), level)


def read_race_file(path: Path, level: str) -> list[ChoiceExample]:
    """One article file: {article, questions[], options[][4], answers[], id}."""
    record = read_json(path, DATA_FILE_LIMIT, "RACE article file")
    if not isinstance(record, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(record).__name__}")
    missing = [k for k in ("article", "questions", "options", "answers") if k not in record]
    if missing:
        raise UserError(f"{path}: missing field(s) {', '.join(missing)}")
    questions, options, answers = record["questions"], record["options"], record["answers"]
    if not all(isinstance(v, list) for v in (questions, options, answers)) or \
            not len(questions) == len(options) == len(answers):
        q, o, a = (len(v) if isinstance(v, list) else type(v).__name__ for v in (questions, options, answers))
        raise UserError(f"{path}: {q} questions, {o} option lists and {a} answers: expected lists of one length")
    if not isinstance(record["article"], str):
        raise UserError(f"{path}: the article holds a {type(record['article']).__name__}, not text")
    return [race_question(record["article"], q, o, a, level, f"{path} question {i + 1}")
            for i, (q, o, a) in enumerate(zip(questions, options, answers))]


def read_race_split(folder: Path, split: str, level: str) -> list[ChoiceExample]:
    where = folder / split / level
    files = sorted(where.glob("*.txt")) if where.is_dir() else []
    if not files:
        raise UserError(f"race: no {where}/*.txt; eval.data_dir must be the RACE folder "
                        "(train/ and dev/, each with high/ and middle/)")
    return [q for path in files for q in read_race_file(path, level)]


def race_hub_split(level: str, split: str) -> list[ChoiceExample]:
    rows = hub_rows("race", RACE_HUB, level, {"train": "train", "dev": "validation"}[split], "eval.data_dir=<RACE folder>")
    return [race_question(str(r.get("article", "")), r.get("question", ""), r.get("options"), r.get("answer"), level,
                          where) for r, where in rows]


def load_race(name: str, data_dir: str | None) -> TaskData:
    """Train on the task's levels; race's dev is scored whole and per level (extra splits race-high, race-middle)."""
    levels = RACE_TASKS[name]
    read = race_hub_split if data_dir is None else lambda level, split: read_race_split(Path(data_dir), split, level)
    train = [q for level in levels for q in read(level, "train")]
    dev_levels = {level: read(level, "dev") for level in levels}
    dev = {"dev": [q for level in levels for q in dev_levels[level]]}
    if len(levels) > 1:
        dev |= {f"race-{level}": rows for level, rows in dev_levels.items()}
    return _task(name, train, dev, f"hub:{RACE_HUB}" if data_dir is None else str(Path(data_dir)))


def refuse_race(e) -> None:
    check(not ("race" in e.tasks and len(e.tasks) > 1), "eval.tasks", e.tasks,
          "race already scores race-high and race-middle (its dev per level): list race alone, or the levels")
