"""What every reader of task data shares: the files checked before any is parsed (so that one run names the
missing one), JSON lines, where a line that is not one object stops the run in one line naming file and line, and a
hub split's rows, each with the place an error names."""

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import UserError
from ..hub import hub_dataset
from ..untrusted import text_lines


def files_source(train_file, dev_file) -> str:
    """Where a task's train and dev files are, as results.json and the model card say it: their folder first (the
    card keeps a path's last part, and a file's name, train.csv, says nothing of the data), then the files."""
    train, dev = Path(train_file).absolute(), Path(dev_file).absolute()
    if train.parent == dev.parent:
        return f"{train.parent} (train={train.name}, dev={dev.name})"
    return f"train={train.parent} ({train.name}), dev={dev.parent} ({dev.name})"


def require_files(task: str, paths: Iterable[Path], must: str) -> None:
    """`must`: what eval.data_dir must be or hold, for the message."""
    for path in paths:
        if not path.is_file():
            raise UserError(f"{task}: missing {path}; eval.data_dir must {must}")


def json_objects(path: Path, place: str = "{path} line {number}") -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line. place: how a message names the line, from path and number
    (each task family keeps the wording its users know)."""
    for number, line in enumerate(text_lines(path), start=1):  # UTF-8, bounded lines (untrusted.py)
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{place.format(path=path, number=number)}: not valid JSON ({err.msg})") from None
        except RecursionError:
            raise UserError(f"{place.format(path=path, number=number)}: nested too deeply") from None
        except ValueError as err:  # a number of thousands of digits: Python's int conversion limit
            raise UserError(f"{place.format(path=path, number=number)}: not a JSON row ({str(err).split(';')[0][:150]})"
                            ) from None
        if not isinstance(record, dict):
            raise UserError(f"{place.format(path=path, number=number)}: expected a JSON object, got "
                            f"{type(record).__name__}")
        yield number, record


def hub_rows(task: str, dataset: str, config: str, split: str, fix: str) -> list[tuple[dict, str]]:
    """(row, where) of one hub split (or the datasets cache, offline); `fix` names the local files to use instead."""
    rows = hub_dataset(task, dataset, config, split=split, fix=fix)
    return [(dict(row), f"hub:{dataset}/{config} {split} row {i}") for i, row in enumerate(rows)]
