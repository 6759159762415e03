"""Read the user's own text: a file, a folder or a glob of text (.txt, .raw, ...) or .jsonl/.json/.parquet/.csv files.

Plain text is streamed line by line and split into documents at blank lines, so memory stays bounded
whatever the file size; .jsonl and .csv are streamed row by row, .parquet batch by batch, and a .json array is
read whole. Text, .jsonl, .json and .csv are decoded with data.encoding / data.encoding_errors; parquet stores
UTF-8 by definition and ignores both. Errors name the file's own byte offset and 1-based line.
"""

import codecs
import csv
import glob
import json
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import UserError
from ..untrusted import leads_outside, link_outside

TEXT_SUFFIXES = {".txt", ".text", ".raw"}  # what a folder is searched for; a named file or glob may be any text
STRUCTURED_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def resolve_files(path: str) -> list[Path]:
    """Expand `path` into a sorted list of readable data files, or say exactly why not."""
    expanded = os.path.expanduser(path)
    if any(ch in expanded for ch in "*?["):
        base = Path(expanded.split("*")[0].split("?")[0].split("[")[0])
        base = base if str(expanded).endswith("/") or base.is_dir() else base.parent
        matches = [Path(p) for p in sorted(glob.glob(expanded, recursive=True)) if Path(p).is_file()]
        if outside := next((p for p in matches if leads_outside(base, p)), None):
            raise UserError(f"data.path={path!r}: {outside} leads outside {base} through a link (to "
                            f"{outside.resolve()}); a data folder's files must lie inside it: copy the file in, or "
                            "name it directly")
        if not matches:
            raise UserError(f"data.path={path!r}: the pattern matched no files")
        files = matches
    elif os.path.isdir(expanded):
        if (link := link_outside(Path(expanded))) is not None:
            raise UserError(f"data.path={path!r}: {link} is a link leading outside the folder (to {link.resolve()}); "
                            "a data folder's files must lie inside it: copy the file in, or name it directly")
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


# data.encoding_errors: Python's own error handlers, each with its one line for docs/options.md.
ENCODING_ERRORS = {
    "strict": "A byte that is not valid in data.encoding stops the run in one line naming the file.",
    "replace": "Each invalid byte becomes U+FFFD, the replacement character, and the run goes on.",
    "ignore": "Invalid bytes are dropped silently.",
}


def encoding_problem(encoding: str, errors: str) -> str | None:
    """data.encoding must be a codec Python knows, data.encoding_errors one of ENCODING_ERRORS."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        return (f"data.encoding={encoding!r} is not a text encoding Python knows; use a codec name such as utf-8, "
                "latin-1, cp1252 or utf-16")
    if errors not in ENCODING_ERRORS:
        return f"data.encoding_errors={errors!r} is not a valid option; choose one of: {', '.join(ENCODING_ERRORS)}"
    return None


def locate_bad_bytes(path: Path, encoding: str) -> tuple[int, int, str]:
    """(byte offset in the file, 1-based line, reason) of the first byte sequence `encoding` cannot decode.
    Python's text reader reports offsets within its 8 KiB read chunk, so the file is scanned again here."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    consumed, newlines = 0, 0
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            pending = decoder.getstate()[0]
            try:
                newlines += decoder.decode(chunk, final=not chunk).count("\n")
            except UnicodeDecodeError as err:
                good = (pending + chunk)[:err.start]
                line = newlines + good.decode(encoding, "replace").count("\n") + 1
                return consumed - len(pending) + err.start, line, err.reason
            if not chunk:
                return consumed, newlines + 1, "unknown"
            consumed += len(chunk)


def _decode_error(path: Path, encoding: str) -> UserError:
    offset, line, reason = locate_bad_bytes(path, encoding)
    return UserError(f"data file {path} is not valid {encoding} at byte {offset:,} (line {line:,}: {reason}); "
                     "set data.encoding=<its encoding> (e.g. latin-1, cp1252), or data.encoding_errors=replace "
                     "or ignore, or re-encode the file")


def _wide(encoding: str) -> bool:
    """UTF-16/32 text is full of NUL bytes; other encodings' NULs mean a binary file."""
    return codecs.lookup(encoding).name.startswith(("utf-16", "utf-32"))


def iter_text_file(path: Path, encoding: str = "utf-8", errors: str = "strict") -> Iterator[str]:
    """Paragraphs (blank-line separated) of a text file; a binary or undecodable file is a UserError."""
    with open(path, "rb") as fh:
        if not _wide(encoding) and b"\x00" in fh.read(8192):
            raise UserError(f"data file {path} looks binary (it contains NUL bytes); give text files only")
    paragraph: list[str] = []
    with open(path, encoding=encoding, errors=errors) as fh:
        try:
            for line in fh:
                if line.strip():
                    paragraph.append(line.strip())
                elif paragraph:
                    yield " ".join(paragraph)
                    paragraph = []
        except UnicodeDecodeError:
            raise _decode_error(path, encoding) from None
    if paragraph:
        yield " ".join(paragraph)


def _text_of(row, field: str, path: Path, where: str) -> str | None:
    """The row's text field; a missing field or one that is not text is a UserError naming the file and line."""
    if not isinstance(row, dict):
        raise UserError(f"data file {path} {where} is a JSON {type(row).__name__}, not an object with a "
                        f"{field!r} field")
    if field not in row:
        raise UserError(f"data file {path} has no field {field!r} ({where}; fields: {', '.join(row)}); "
                        "set data.text_field")
    text = row[field]
    if text is not None and not isinstance(text, str):
        raise UserError(f"data file {path} {where}: the field {field!r} holds {type(text).__name__}, not text; "
                        "set data.text_field to a text field")
    return text


def iter_json_lines(path: Path, field: str, encoding: str, errors: str) -> Iterator[str]:
    with open(path, encoding=encoding, errors=errors) as fh:
        try:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise UserError(f"data file {path} line {number:,} is not valid JSON ({err.msg} at column "
                                    f"{err.colno}); fix or remove that line") from None
                except RecursionError:
                    raise UserError(f"data file {path} line {number:,} nests too deeply to be a row") from None
                except ValueError as err:  # a number of thousands of digits: Python's int conversion limit
                    raise UserError(f"data file {path} line {number:,} is not a row "
                                    f"({str(err).split(';')[0][:150]})") from None
                yield _text_of(row, field, path, f"line {number:,}")
        except UnicodeDecodeError:
            raise _decode_error(path, encoding) from None


def iter_json_array(path: Path, field: str, encoding: str, errors: str) -> Iterator[str]:
    """A .json file holding one array of objects (or of strings), read whole as JSON requires."""
    try:
        rows = json.loads(path.read_text(encoding=encoding, errors=errors))
    except UnicodeDecodeError:
        raise _decode_error(path, encoding) from None
    except json.JSONDecodeError as err:
        raise UserError(f"data file {path} is not valid JSON at line {err.lineno:,}, column {err.colno} "
                        f"({err.msg})") from None
    except RecursionError:
        raise UserError(f"data file {path} nests too deeply to be an array of rows") from None
    except ValueError as err:
        raise UserError(f"data file {path} is not an array of rows ({str(err).split(';')[0][:150]})") from None
    for index, row in enumerate(rows if isinstance(rows, list) else [rows]):
        yield row if isinstance(row, str) else _text_of(row, field, path, f"item {index:,}")


def iter_csv(path: Path, field: str, encoding: str, errors: str) -> Iterator[str]:
    csv.field_size_limit(2**31 - 1)  # documents are long; the default cap is 128 KiB per field
    with open(path, encoding=encoding, errors=errors, newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            for row in reader:
                yield _text_of(row, field, path, f"line {reader.line_num:,}")
        except UnicodeDecodeError:
            raise _decode_error(path, encoding) from None
        except csv.Error as err:
            raise UserError(f"data file {path} line {reader.line_num:,} is not valid CSV ({err})") from None


def iter_parquet(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq  # only for .parquet files: the other formats need no pyarrow

    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001  pyarrow raises several types for a file that is not parquet
        raise UserError(f"data file {path} could not be read as parquet: {str(err).splitlines()[0]}") from None
    names = table.schema_arrow.names
    if field not in names:
        raise UserError(f"data file {path} has no field {field!r} (fields: {', '.join(names)}); set data.text_field")
    kind = table.schema_arrow.field(field).type
    if not (str(kind) in ("string", "large_string", "string_view")):
        raise UserError(f"data file {path}: the field {field!r} holds {kind}, not text; set data.text_field "
                        "to a text field")
    for batch in table.iter_batches(columns=[field], batch_size=1024):
        yield from batch.column(0).to_pylist()


def iter_documents(files: list[Path], text_field: str, encoding: str = "utf-8",
                   errors: str = "strict") -> Iterator[str]:
    for f in files:
        suffix = f.suffix.lower()
        if suffix == ".parquet":
            texts = iter_parquet(f, text_field)
        elif suffix == ".csv":
            texts = iter_csv(f, text_field, encoding, errors)
        elif suffix == ".json" and _starts_with_bracket(f, encoding):
            texts = iter_json_array(f, text_field, encoding, errors)
        elif suffix in (".json", ".jsonl"):
            texts = iter_json_lines(f, text_field, encoding, errors)
        else:
            yield from iter_text_file(f, encoding, errors)
            continue
        yield from (text for text in texts if text and text.strip())


def _starts_with_bracket(path: Path, encoding: str) -> bool:
    with open(path, encoding=encoding, errors="replace") as fh:
        return fh.read(4096).lstrip("\ufeff \t\r\n").startswith("[")
