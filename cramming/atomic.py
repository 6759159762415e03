"""Files that other processes read or share: written whole or not at all, changed under a lock.

`write_atomic` / `atomic_open` write a temporary file in the same folder, flush it to disk and rename it over the
target, so a reader (or a run killed mid-write) sees the old file or the new one, never half of one; a write the
file system refuses (full, read-only) is one line naming the folder (outputs.writing). `locked`
serialises read-modify-write cycles (a sweep's manifest, results.csv, the remembered microbatch sizes) across the
processes of a sweep, with `filelock` (a `<file>.lock` beside the file)."""

import contextlib
import os
import tempfile
from pathlib import Path

from filelock import FileLock

from .errors import UserError
from .outputs import writing


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", **kwargs):
    """A file handle whose content replaces `path` only when the block ends without an exception."""
    path = Path(path)
    with writing(path.parent, path.name):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with writing(path.parent, path.name), os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; these files are shared like any other
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_atomic(path, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def locked(path) -> FileLock:
    """An exclusive lock for `path` across processes (blocks until free): `with locked(path): ...`. The lock file
    beside it must be a plain file (or absent): a link or a folder there is one line, never written through."""
    lock = Path(f"{path}.lock")
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise UserError(f"{lock} is not a lock file (a link or a folder stands there); remove it")
    lock.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(lock))
