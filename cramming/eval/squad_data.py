"""SQuAD v1.1 and v2.0 (eval=squad): the options, and the reader for the official JSON files or the hub copies.

The official files nest data -> paragraphs -> (context, qas -> (id, question, answers -> (text, answer_start),
is_impossible in v2.0)). Every answer must sit at its answer_start in the context: the training labels are
character spans, so a misplaced one would teach the wrong tokens; such a file stops the run before any training,
in one line naming the file, the question id and where in the JSON it is.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ..errors import UserError
from ..hub import hub_dataset
from ..registry import Registry
from ..untrusted import DATA_FILE_LIMIT, read_text
from .files import require_files


@dataclass
class SquadOptions:
    """How eval=squad cuts long contexts into windows and reads answers back out of the logits (docs/squad.md)."""

    doc_stride: int = 128  # tokens that consecutive windows of a long context share
    max_query_length: int = 64  # question tokens kept (a longer question is cut)
    max_answer_length: int = 30  # the longest answer span predicted, in tokens
    n_best: int = 20  # start and end candidates per window searched for the best span
    null_threshold: float = 0.0  # SQuAD v2.0: answer nothing when null score - best span score > this

    COMPONENT: ClassVar[tuple] = ("kind", "squad")  # read only when eval.kind=squad (cramming/rules.py)
    RULES: ClassVar[dict] = {"doc_stride": ">= 1", "max_query_length": ">= 1", "max_answer_length": ">= 1",
                             "n_best": ">= 1"}


@dataclass(frozen=True)
class SquadVersion:
    """One SQuAD release: its task name, whether questions may lack an answer, its files and hub copy."""

    name: str  # the eval.tasks name
    version: int  # 1: every question has an answer; 2: some have none (is_impossible)
    files: tuple[str, str]  # train and dev file names in eval.data_dir (the official ones)
    hub: str  # the hub dataset id


SQUAD_TASKS = Registry("SQuAD task")
for _spec in (SquadVersion("squad", 1, ("train-v1.1.json", "dev-v1.1.json"), "rajpurkar/squad"),
              SquadVersion("squad_v2", 2, ("train-v2.0.json", "dev-v2.0.json"), "rajpurkar/squad_v2")):
    SQUAD_TASKS.register(_spec.name)(_spec)


@dataclass
class SquadExample:
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)  # (text, answer_start); [] = unanswerable (v2.0)


class Where:
    """Names a place in a file for error lines: the file, the line holding a question id, the JSON path."""

    def __init__(self, path: str, raw: str | None):
        self.path, self.raw = path, raw

    def __call__(self, json_path: str, qid=None) -> str:
        line = ""
        if self.raw is not None and isinstance(qid, str) and qid:  # the id's first occurrence: cheap, and exact
            at = self.raw.find(json.dumps(qid))
            line = f" line {self.raw.count(chr(10), 0, at) + 1}" if at >= 0 else ""
        return f"{self.path}{line}: {json_path}" + (f" (question id {qid})" if qid is not None else "")


def _key(obj, key: str, where: str, kind=None):
    if not isinstance(obj, dict) or key not in obj:
        raise UserError(f"{where}: missing key {key!r}")
    value = obj[key]
    if kind is not None and not isinstance(value, kind):
        raise UserError(f"{where}: {key!r} must be a {kind.__name__}, not {type(value).__name__}")
    return value


def check_answers(qid, context: str, answers: list, impossible: bool, version: int, where: str):
    """[(text, answer_start)] of one question, each found at its answer_start, or a one-line UserError."""
    if impossible and version == 1:
        raise UserError(f"{where}: is_impossible is a SQuAD v2.0 field; use eval.tasks=[squad_v2] for this file")
    if impossible and answers:
        raise UserError(f"{where}: is_impossible is true but the question has {len(answers)} answer(s)")
    if not impossible and not answers:
        fix = "v1.1 needs at least one" if version == 1 else "mark it is_impossible: true or give one"
        raise UserError(f"{where}: the question has no answers (SQuAD {fix})")
    out = []
    for k, answer in enumerate(answers):
        at = f"{where} answers[{k}]"
        text, start = _key(answer, "text", at, str), _key(answer, "answer_start", at, int)
        if not text or context[start:start + len(text)] != text or start < 0:
            raise UserError(f"{at}: answer {text!r} is not at answer_start {start} in the context "
                            f"(there it reads {context[max(start, 0):max(start, 0) + len(text)]!r})")
        out.append((text, start))
    return out


def parse_squad(document, version: int, where: Where) -> list[SquadExample]:
    """The questions of one official SQuAD JSON document (already parsed), checked."""
    examples, seen = [], set()
    for i, article in enumerate(_key(document, "data", where("top level"), list)):
        paragraphs = _key(article, "paragraphs", where(f"data[{i}]"), list)
        for j, paragraph in enumerate(paragraphs):
            at = f"data[{i}].paragraphs[{j}]"
            context = _key(paragraph, "context", where(at), str)
            for k, qa in enumerate(_key(paragraph, "qas", where(at), list)):
                qid = qa.get("id") if isinstance(qa, dict) else None
                here = where(f"{at}.qas[{k}]", qid)
                qid, question = _key(qa, "id", here, str), _key(qa, "question", here, str)
                if qid in seen:
                    raise UserError(f"{here}: the question id appears twice; predictions are keyed by it")
                seen.add(qid)
                impossible = qa.get("is_impossible", False) is True
                answers = check_answers(qid, context, _key(qa, "answers", here, list), impossible, version, here)
                examples.append(SquadExample(qid, question, context, answers))
    if not examples:
        raise UserError(f"{where.path}: no questions")
    return examples


def read_squad_file(path: Path, version: int) -> list[SquadExample]:
    raw = read_text(path, DATA_FILE_LIMIT, "SQuAD file")  # UTF-8, its size bounded
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} line {err.lineno}: not JSON ({err.msg}, column {err.colno})") from None
    except RecursionError:
        raise UserError(f"{path}: nests too deeply to be a SQuAD file") from None
    except ValueError as err:  # a number of thousands of digits: Python's int conversion limit
        raise UserError(f"{path}: not a SQuAD file ({str(err).split(';')[0][:150]})") from None
    return parse_squad(document, version, Where(str(path), raw))


def read_squad_hub(spec: SquadVersion, split: str) -> list[SquadExample]:
    """One split of the hub copy (or the datasets cache, offline), checked as the files are."""
    rows = hub_dataset(spec.name, spec.hub, split=split,
                      fix="eval.data_dir=<folder with the official SQuAD JSON files>")
    examples = []
    for i, row in enumerate(rows):
        here = f"hub:{spec.hub} {split} row {i} (question id {row['id']})"
        gold = row["answers"]
        answers = [{"text": t, "answer_start": s} for t, s in zip(gold["text"], gold["answer_start"])]
        answers = check_answers(row["id"], row["context"], answers, spec.version == 2 and not answers,
                                spec.version, here)
        examples.append(SquadExample(row["id"], row["question"], row["context"], answers))
    return examples


def load_squad_examples(name: str, data_dir: str | None) -> tuple[SquadVersion, list, list, str]:
    """(spec, train, dev, source) of one SQuAD version, from the official files in data_dir or (None) the hub."""
    try:
        spec = SQUAD_TASKS.get_or_explain(name)
    except ValueError as err:
        raise UserError(str(err)) from None
    if data_dir is None:
        return spec, read_squad_hub(spec, "train"), read_squad_hub(spec, "validation"), f"hub:{spec.hub}"
    folder = Path(data_dir)
    paths = [folder / f for f in spec.files]
    require_files(spec.name, paths, f"hold the official SQuAD files ({'/'.join(spec.files)})")
    return spec, *(read_squad_file(p, spec.version) for p in paths), str(folder)
