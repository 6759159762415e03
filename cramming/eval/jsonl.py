"""The one JSONL reader of the evaluation's task files (custom tasks, SuperGLUE, zero-shot): one JSON object per
non-blank line, and a line that is not one stops the run in one line naming the file and the line."""

import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError


def json_objects(path: Path, place: str = "{path} line {number}") -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line. place: how a message names the line, from path and number
    (each task family keeps the wording its users know)."""
    with open(path, encoding="utf-8-sig") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{place.format(path=path, number=number)}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise UserError(f"{place.format(path=path, number=number)}: expected a JSON object, got "
                                f"{type(record).__name__}")
            yield number, record
