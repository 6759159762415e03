"""Read the user's own text: a file, a folder or a glob of text (.txt, .raw, ...) or .jsonl/.json/.parquet/.csv files.

Plain text is streamed line by line and split into documents at blank lines, so memory stays bounded
whatever the file size; structured files are streamed through `datasets`.
"""

import glob
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError

TEXT_SUFFIXES = {".txt", ".text", ".raw"}  # what a folder is searched for; a named file or glob may be any text
STRUCTURED_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def resolve_files(path: str) -> list[Path]:
    """Expand `path` into a sorted list of readable data files, or say exactly why not."""
    expanded = os.path.expanduser(path)
    if any(ch in expanded for ch in "*?["):
        matches = [Path(p) for p in sorted(glob.glob(expanded, recursive=True)) if Path(p).is_file()]
        if not matches:
            raise UserError(f"data.path={path!r}: the pattern matched no files")
        files = matches
    elif os.path.isdir(expanded):
        files = sorted(p for p in Path(expanded).rglob("*") if p.is_file() and _supported(p))
        if not files:
            kinds = ", ".join(sorted(TEXT_SUFFIXES | set(STRUCTURED_SUFFIXES)))
            raise UserError(f"data.path={path!r}: the folder holds no data files ({kinds})")
    elif os.path.isfile(expanded):
        files = [Path(expanded)]
    else:
        raise UserError(f"data.path={path!r}: no such file or folder")
    return files


def _supported(p: Path) -> bool:
    return p.suffix.lower() in TEXT_SUFFIXES or p.suffix.lower() in STRUCTURED_SUFFIXES


def fingerprint(files: list[Path]) -> list:
    """What identifies the input for the cache key: names, sizes and modification times."""
    return [[str(f.resolve()), f.stat().st_size, int(f.stat().st_mtime)] for f in files]


def iter_text_file(path: Path) -> Iterator[str]:
    """Paragraphs (blank-line separated) of a UTF-8 text file; a binary or non-UTF-8 file is a UserError."""
    with open(path, "rb") as fh:
        if b"\x00" in fh.read(8192):
            raise UserError(f"data file {path} looks binary (it contains NUL bytes); give text files only")
    paragraph: list[str] = []
    with open(path, encoding="utf-8", errors="strict") as fh:
        try:
            for line in fh:
                if line.strip():
                    paragraph.append(line.strip())
                elif paragraph:
                    yield " ".join(paragraph)
                    paragraph = []
        except UnicodeDecodeError as err:
            raise UserError(f"data file {path} is not valid UTF-8 ({err.reason} at byte {err.start}); re-encode it") from None
    if paragraph:
        yield " ".join(paragraph)


def iter_structured_file(path: Path, text_field: str) -> Iterator[str]:
    from datasets import load_dataset

    kind = STRUCTURED_SUFFIXES[path.suffix.lower()]
    try:
        rows = load_dataset(kind, data_files=[str(path)], split="train", streaming=True)
        for row in rows:
            if text_field not in row:
                raise UserError(
                    f"data file {path} has no field {text_field!r} (fields: {', '.join(row)}); set data.text_field"
                )
            text = row[text_field]
            if isinstance(text, str) and text.strip():
                yield text
    except UserError:
        raise
    except Exception as err:  # pyarrow / json errors on malformed files
        raise UserError(f"data file {path} could not be read as {kind}: {str(err).splitlines()[0]}") from None


def iter_documents(files: list[Path], text_field: str) -> Iterator[str]:
    for f in files:
        if f.suffix.lower() in STRUCTURED_SUFFIXES:
            yield from iter_structured_file(f, text_field)
        else:
            yield from iter_text_file(f)
