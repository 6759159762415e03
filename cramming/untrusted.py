"""Reading what someone else may have written: checkpoints, step folders, hub snapshots, prepared data, data files
and run folders (docs/security.md, *What is not trusted*).

Every such read goes through here, so that its rules hold in one place:
- a path that a folder's contents name stays inside that folder: `..`, an absolute name or a link leading out is
  refused (`inside`, `link_outside`);
- a file's size is read before the file is, and held against a bound for its kind (`read_json`, `check_size`);
- text is UTF-8, line by line with each line bounded, and an error names the file, the line and the byte
  (`text_lines`);
- what a folder says is data: a value that looks like an OmegaConf interpolation (`${oc.env:...}`) is refused,
  never resolved (`plain_data`);
- what a folder asks to be allocated is held against the memory this machine has (`check_memory`).
A refusal is a UserError: one line naming the file, the size or the place, and what to do.
"""

import json
import os
import resource
from collections.abc import Iterator
from pathlib import Path

from .errors import UserError

MiB = 1 << 20
JSON_LIMIT = 16 * MiB  # config.json, tokenizer_config.json, a summary, an index: kilobytes in practice
TOKENIZER_LIMIT = 100 * MiB  # the largest real tokenizer.json we know of (Gemma's) is about 33 MB
LINE_LIMIT = 4 * MiB  # one line of a task's data file: far past what any max_length keeps
DATA_FILE_LIMIT = 256 * MiB  # a data file read whole (SQuAD's JSON: 40 MB)


def size_text(nbytes: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:,.0f} bytes" if unit == "bytes" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- paths


def leads_outside(folder: Path, path: Path) -> bool:
    """Whether `path`, its links followed, lies outside `folder` (its links followed too)."""
    return not Path(path).resolve().is_relative_to(Path(folder).resolve())


def inside(folder: Path, name: str | Path, what: str) -> Path:
    """`folder / name`, its links followed, when that stays inside `folder`; refused otherwise. `what` names the
    file that named `name` (an index's weight_map, a folder's own entry), for the message."""
    folder = Path(folder)
    path = folder / name
    if Path(name).is_absolute() or leads_outside(folder, path):
        raise UserError(f"{what}: {str(name)!r} leads outside {folder} (to {path.resolve()}); a folder's files must "
                        "lie inside it, so it was not read")
    return path.resolve()


def link_outside(folder: Path) -> Path | None:
    """The first entry under `folder` (links not followed) that is a link leading outside it or to nothing."""
    real = Path(folder).resolve()
    for root, dirs, files in os.walk(real, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(root) / name
            if path.is_symlink() and (not path.exists() or not path.resolve().is_relative_to(real)):
                return path
    return None


def refuse_links_outside(folder: Path, what: str) -> None:
    """One line when any link under `folder` leads outside it: `what` would read or send the file it points to."""
    if (link := link_outside(folder)) is not None:
        target = os.readlink(link)
        raise UserError(f"{link} is a link to {target}, outside {folder}; {what} reads only the folder's own files: "
                        "replace the link by a copy of the file, or remove it")


# ---------------------------------------------------------------- sizes


def check_size(path: Path, limit: int, what: str = "it") -> int:
    """The file's size in bytes, refused past `limit` (`what`: the kind of file, for the message)."""
    size = Path(path).stat().st_size
    if size > limit:
        raise UserError(f"{path}: {size_text(size)}, larger than any {what} cramming reads ({size_text(limit)} at "
                        "most); it was not read")
    return size


# The files a tokenizer is read from: each bounded before transformers reads it.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "chat_template.jinja")


def check_tokenizer_files(folder: Path) -> None:
    """Each tokenizer file of a folder within a tokenizer's size, before anything parses it."""
    for name in TOKENIZER_FILES:
        if (Path(folder) / name).is_file():
            check_size(Path(folder) / name, TOKENIZER_LIMIT, "tokenizer file")


def available_memory() -> int | None:
    """Bytes this process could still allocate: the machine's (Linux's MemAvailable), or less where a limit on the
    process's address space (ulimit -v) leaves less; None where neither can be read."""
    free = None
    try:
        with open("/proc/meminfo") as fh:
            free = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")), None)
    except OSError:
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as fh:
                used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            used = 0
        free = max(0, limit - used) if free is None else min(free, max(0, limit - used))
    return free


def check_memory(nbytes: int, what: str, fix: str) -> None:
    """Refuse to allocate `nbytes` for `what` (a line naming its file and size) when this machine has less."""
    free = available_memory()
    if free is not None and nbytes > free:
        raise UserError(f"{what} needs {size_text(nbytes)} of memory, more than the {size_text(free)} this machine "
                        f"has available; it was not loaded ({fix})")


# ---------------------------------------------------------------- text and JSON


def _decode(raw: bytes, path: Path, number: int, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path} line {number:,}: not valid UTF-8 at byte {offset + err.start:,} ({err.reason}); "
                        "save the file as UTF-8") from None


def regular_file(path: Path) -> Path:
    """`path`, when it is a regular file (links followed): a folder, a FIFO or a device is one line."""
    if not Path(path).is_file():
        what = "a folder" if Path(path).is_dir() else "missing" if not Path(path).exists() else "not a regular file"
        raise UserError(f"{path}: {what}; a file cramming reads must be a regular file")
    return Path(path)


def text_lines(path: Path, limit: int = LINE_LIMIT) -> Iterator[str]:
    """The file's lines as text, each with its line ending (what csv.reader reads); a byte-order mark dropped.
    A line longer than `limit` bytes, or one that is not UTF-8, stops the reading in one line naming it."""
    path = regular_file(path)
    with open(path, "rb") as fh:
        offset = 0
        for number in range(1, 1 << 62):
            raw = fh.readline(limit + 1)
            if not raw:
                return
            if len(raw) > limit and not raw.endswith(b"\n"):
                raise UserError(f"{path} line {number:,} is longer than {size_text(limit)} (a text cramming reads "
                                "is far shorter); it was not read: split or shorten that line")
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw, offset = raw[3:], 3
            yield _decode(raw, path, number, offset)
            offset += len(raw)


def read_text(path: Path, limit: int = DATA_FILE_LIMIT, what: str = "text file") -> str:
    """A whole UTF-8 file (a byte-order mark dropped), its size checked first."""
    path = regular_file(path)
    check_size(path, limit, what)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as err:
        raise UserError(f"{path}: cannot be read ({err.strerror or type(err).__name__})") from None
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise UserError(f"{path} line {line:,}: not valid UTF-8 at byte {err.start:,} ({err.reason}); save the "
                        "file as UTF-8") from None


def read_json(path: Path, limit: int = JSON_LIMIT, what: str = "JSON file"):
    """A JSON file someone else may have written: its size checked, its text UTF-8, its JSON valid; each failure
    one line naming the file."""
    text = read_text(path, limit, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} line {err.lineno:,}: not valid JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a {what}") from None
    except ValueError as err:  # a number of thousands of digits (Python's int conversion limit), ...
        raise UserError(f"{path}: not a {what} ({str(err).split(';')[0][:150]})") from None


def read_json_object(path: Path, limit: int = JSON_LIMIT, what: str = "JSON file") -> dict:
    value = read_json(path, limit, what)
    if not isinstance(value, dict):
        raise UserError(f"{path}: a {what} is a JSON object, this holds a {type(value).__name__}")
    return value


# ---------------------------------------------------------------- values


def plain_data(value, where: str) -> None:
    """Refuse a value read from a folder that OmegaConf would resolve (`${oc.env:SECRET}`, `${...}`): a folder
    is data, and resolving it could read the environment into a message or a run. The value is not echoed."""
    todo = [(where, value)]  # a stack of its own: a folder's data may nest deeper than Python's recursion allows
    while todo:
        where, value = todo.pop()
        if isinstance(value, dict):
            todo += [(f"{where} (a key)", key) for key in value]
            todo += [(f"{where}.{key}" if len(where) < 200 else where, item) for key, item in value.items()]
        elif isinstance(value, list | tuple):
            todo += [(f"{where}[{i}]" if len(where) < 200 else where, item) for i, item in enumerate(value)]
        elif isinstance(value, str) and "${" in value:
            raise UserError(f"{where} holds an interpolation (${{...}}), which cramming never writes there and never "
                            "resolves from a folder; the folder was not used")
