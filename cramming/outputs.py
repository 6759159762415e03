"""Writing only what is ours (docs/security.md, *What each command writes*).

- An output folder the user names (an export, a run folder) is written only when it is absent, empty, or one this
  package wrote before (`claim_folder` with the kind's own test); anything else in it is refused in one line.
- A folder is written under a temporary name of its own (`temp_folder`: unique, so never someone else's) and takes
  its final name whole (`replace_folder`); what this process made is what a failure removes, nothing more.
- A write that fails because the disk is full, the file system is read-only or the folder is not writable is one
  line naming the folder and the space left (`writing`), and the temporary folder is gone.
"""

import contextlib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import UserError
from .untrusted import size_text

# What the file system answers when a write cannot go through, whatever the writer.
FAULTS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
          errno.EROFS: "the file system is read-only", errno.EACCES: "the folder is not writable",
          errno.EPERM: "the folder is not writable", errno.EFBIG: "the file is too large for the file system"}


SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


def fault_reason(err: BaseException, folder: Path) -> str | None:
    """Why a write into `folder` failed when it is the file system's doing (full, read-only, not writable), or None
    for any other failure. torch.save's writer says only "file write failed": the folder is then asked."""
    if isinstance(err, OSError) and err.errno in FAULTS:
        return FAULTS[err.errno]
    text = str(err)
    for code, reason in FAULTS.items():
        if os.strerror(code) in text:
            return reason
    if isinstance(err, OSError) and SHORT_WRITE.search(text):  # numpy's tofile: the disk took only part of it
        return FAULTS[errno.ENOSPC]
    if not isinstance(err, OSError | RuntimeError):
        return None
    existing = next((p for p in [Path(folder), *Path(folder).parents] if p.exists()), None)
    if existing is None:
        return None
    stats = os.statvfs(existing)
    if stats.f_flag & os.ST_RDONLY:
        return FAULTS[errno.EROFS]
    if stats.f_bavail * stats.f_frsize < 1 << 20:  # less than a MiB left: the write ran out of room
        return FAULTS[errno.ENOSPC]
    if not os.access(existing, os.W_OK):
        return FAULTS[errno.EACCES]
    return None


class WriteFault(UserError):
    """A write the file system refused: the one line, and its short `reason` for callers that go on without it."""

    def __init__(self, line: str, reason: str):
        super().__init__(line)
        self.reason = reason


def free_space(folder: Path) -> str:
    existing = next((p for p in [Path(folder), *Path(folder).parents] if p.exists()), Path("/"))
    return size_text(shutil.disk_usage(existing).free)


@contextlib.contextmanager
def writing(folder: Path, what: str, made: list[Path] = ()):
    """Convert a write the file system refuses into one line naming `folder` and what was being written; the
    paths in `made` (what this process created for the write) are removed first. Other errors pass unchanged."""
    try:
        yield
    except Exception as err:
        reason = fault_reason(err, folder)
        if reason is None:
            raise
        for path in made:
            remove(path)
        raise WriteFault(f"cannot write {what} in {folder}: {reason} ({free_space(folder)} free); nothing was left "
                         "half-written: free some space or choose another folder", reason) from None


def remove(path: Path) -> None:
    """Remove a file or folder this process made (gone already is fine)."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def temp_folder(parent: Path, name: str) -> Path:
    """A new folder `<name>.<random>.tmp` beside where `name` will go: made here, so ours alone to remove."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}.", suffix=".tmp", dir=parent))


def foreign_entry(folder: Path, ours: Callable[[Path], bool]) -> Path | None:
    """The first entry of an existing folder that `ours` does not recognise, or None when all are ours."""
    for path in sorted(Path(folder).iterdir()):
        if path.is_symlink() or not ours(path):
            return path
    return None


def claim_folder(path: Path, ours: Callable[[Path], bool], what: str) -> None:
    """Refuse to write `what` into `path` when it exists as anything but a folder that is empty or holds only
    entries `ours` recognises."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        raise UserError(f"{path} exists and is not a folder; give a new folder to write {what} into")
    if (entry := foreign_entry(path, ours)) is not None:
        raise UserError(f"{path} already holds {entry.name!r}, which cramming did not write; it was left as it is: "
                        f"give a new (or empty) folder to write {what} into")


def replace_folder(tmp: Path, final: Path) -> None:
    """Give the finished folder `tmp` the name `final`. An existing `final` (checked by claim_folder to be empty or
    ours) is moved aside first and removed after, so a failure between leaves one of the two whole."""
    tmp, final = Path(tmp), Path(final)
    old = None
    if final.exists():
        old = temp_folder(final.parent, f"{final.name}.old")
        os.rename(final, old / final.name)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
