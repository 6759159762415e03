"""A run's folder is its own (docs/security.md): new for each launch, inside outputs/, written by one process at a
time, and after a refusal only what this process added to it is removed.

- conf/pretrain.yaml and conf/eval.yaml name their folders `${cramming_run_folder:outputs,${name}}`: the resolver
  checks `name` (a relative path that stays inside outputs/) and makes `outputs/<name>/<date>_<time>` with one
  atomic mkdir, `-2`, `-3`, ... appended when another launch took that second. OmegaConf caches the answer per
  config, so every reading of hydra.run.dir in one launch (and a sweep's jobs, whose configs copy the cache) sees
  the same folder.
- `RunFolder`, a Hydra callback, holds the folder before Hydra writes into it: one the user names
  (hydra.run.dir=..., hydra.sweep.dir=...) must be absent, empty or a run folder of ours (it holds .hydra/, a
  requeued job continuing in place), else the launch is refused; and a lock (flock on the folder) refuses a
  second live process in the same folder.
- `undo_refused` removes, after a refusal, what this process added when that is only Hydra's bookkeeping, and
  the folders it made once empty; never anything that was there before.

A refusal here happens while Hydra composes or starts the job, where it would swallow or wrap an exception, so
it is printed as the one `error:` line and exits with code 2 at once.
"""

import contextlib
import fcntl
import os
import sys
import weakref
from datetime import datetime
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from .errors import EXIT_USER_ERROR
from .outputs import remove
from .untrusted import leads_outside, link_outside

STAMP = "%Y-%m-%d_%H-%M-%S"
MADE: set[Path] = set()  # folders this process made (resolved paths): the only folders a refusal may remove
BEFORE: dict[Path, set[str]] = {}  # a held folder's entries before this process wrote into it
BOOKKEEPING = (".hydra",)  # with the job's *.log: what Hydra writes into a run folder before the run starts


def stop(line: str):
    """Print the one line and exit 2 now (SystemExit passes through Hydra's and OmegaConf's handlers)."""
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def name_problem(name) -> str | None:
    """`name` names the run's folder under outputs/: a relative path of plain parts, so it cannot leave it."""
    text = str(name)
    parts = text.split("/")
    if (not text or text.startswith(("/", "~")) or "\\" in text or any(p in ("", ".", "..") for p in parts)
            or any(not c.isprintable() for c in text) or any(len(p.encode()) > 200 for p in parts)):
        return (f"name={text!r} is invalid: it names the run's folder under outputs/, so it must be a relative path "
                "of plain parts (no '..', no leading '/' or '~', no empty part, none over 200 bytes); e.g. name=crammed or "
                "name=ablation/rope")
    return None


def make_folder(path: Path) -> bool:
    """mkdir, each missing parent too (remembered in MADE); False when `path` itself exists already."""
    path = Path(path).absolute()
    try:
        for parent in reversed(path.parents):
            if not parent.exists():
                with contextlib.suppress(FileExistsError):
                    parent.mkdir()
                    MADE.add(parent.resolve())
        path.mkdir()
    except FileExistsError:
        return False
    except OSError as err:  # a read-only or full file system: one line before Hydra tries the same
        undo_made()
        stop(f"cannot make the run folder {path}: {err.strerror}; give hydra.run.dir a folder that can be written")
    MADE.add(path.resolve())
    return True


def new_run_folder(base: str, name) -> str:
    """`<base>/<name>/<date>_<time>[-n]`, made now and new: the resolver of hydra.run.dir and hydra.sweep.dir."""
    if problem := name_problem(name):
        stop(problem)
    if leads_outside(base, Path(base) / str(name)):  # a link under outputs/ must not take the run elsewhere
        stop(f"name={name!r}: {Path(base) / str(name)} leads outside {base}/ through a link (to "
             f"{(Path(base) / str(name)).resolve()}); give another name, or remove the link")
    stamp = datetime.now().strftime(STAMP)
    for number in range(1, 10_000):
        path = Path(base) / str(name) / (stamp if number == 1 else f"{stamp}-{number}")
        if make_folder(path):
            return str(path)
    stop(f"{Path(base) / str(name)}: 10,000 launches in one second; give hydra.run.dir")


if not OmegaConf.has_resolver("cramming_run_folder"):
    OmegaConf.register_new_resolver("cramming_run_folder", new_run_folder, use_cache=True)


def is_run_folder(folder: Path) -> bool:
    """A folder a cramming command ran in before: Hydra's bookkeeping of a cramming job (.hydra/hydra.yaml, or a
    sweep's multirun.yaml, naming cramming's own callbacks and help), or a sweep's manifest."""
    for record in (folder / ".hydra" / "hydra.yaml", folder / "multirun.yaml"):
        if record.is_file() and not record.is_symlink() and record.stat().st_size < 1 << 20 \
                and "cramming" in record.read_text(encoding="utf-8", errors="replace"):
            return True
    return (folder / "manifest.json").is_file() and not (folder / "manifest.json").is_symlink()


def claim(folder: Path, key: str) -> None:
    """Make `folder` (absent), or accept it (empty, or a run folder of ours); else refuse without writing."""
    folder = Path(folder).absolute()
    if folder.resolve() in MADE:
        BEFORE.setdefault(folder.resolve(), set())
        return
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        stop(f"{key}={folder} exists and is not a folder; give a new folder")
    if make_folder(folder):
        BEFORE[folder.resolve()] = set()
        return
    entries = sorted(os.listdir(folder))
    if entries and not is_run_folder(folder):
        stop(f"{key}={folder} already holds {entries[0]!r} and is not a run folder of cramming's; nothing was "
             "written: give a new or empty folder (a run continues in place only in its own folder)")
    if (link := link_outside(folder)) is not None:  # Hydra and the run would write through it
        stop(f"{key}={folder}: {link} is a link leading outside the folder; nothing was written: a run folder's "
             "files must lie inside it (remove the link)")
    BEFORE[folder.resolve()] = set(entries)


def lock(folder: Path, key: str):
    """An exclusive lock on the folder for this process's life (or until released): a second launch into the
    same folder is refused. None where the file system has no locks (the folder is then used unlocked)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        stop(f"{key}={folder} is in use by another running launch; wait for it, or give another folder")
    except OSError:
        os.close(fd)
        return None
    return fd


class RunFolder(Callback):
    """Hydra callback (conf/pretrain.yaml, conf/eval.yaml): claims and locks the run's (or the sweep's) folder
    before Hydra writes into it. Under torchrun only rank 0 has a folder (the others run in '.', writing nothing)."""

    def __init__(self):
        self.fd = None
        weakref.finalize(self, self.release)

    def hold(self, config, key: str) -> None:
        if os.environ.get("RANK", "0") != "0":
            return
        folder = Path(str(OmegaConf.select(config, key)))  # resolves the default: a new folder, made
        claim(folder, key)
        self.fd = lock(folder, key)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def on_run_start(self, config, **kwargs) -> None:
        self.hold(config, "hydra.run.dir")

    def on_multirun_start(self, config, **kwargs) -> None:
        self.hold(config, "hydra.sweep.dir")

    def on_run_end(self, config, **kwargs) -> None:
        self.release()

    def on_multirun_end(self, config, **kwargs) -> None:
        self.release()


def undo_made() -> None:
    """After a launch failed before its job began: each folder this process made, deepest first, removed when it
    holds only Hydra's bookkeeping (or nothing)."""
    for folder in sorted(MADE, key=lambda p: len(p.parts), reverse=True):
        if folder.is_dir() and all(p.name in BOOKKEEPING or p.suffix == ".log" for p in folder.iterdir()):
            for path in folder.iterdir():
                remove(path)
            with contextlib.suppress(OSError):
                folder.rmdir()
            MADE.discard(folder)


def undo_refused(run_dir: Path) -> None:
    """After a refusal: remove what this process added to `run_dir` when that is only Hydra's bookkeeping (.hydra/,
    the job's log), then the folders this process made, once empty, from `run_dir` up. What was there before,
    and a folder that holds anything else (a checkpoint, a metrics log), is kept."""
    run_dir = Path(run_dir).absolute()
    if not run_dir.is_dir():
        return
    before = BEFORE.get(run_dir.resolve(), set(os.listdir(run_dir)))
    added = [p for p in run_dir.iterdir() if p.name not in before]
    if not all(p.name in BOOKKEEPING or (p.suffix == ".log" and p.is_file()) for p in added):
        return
    for path in added:
        remove(path)
    for folder in [run_dir, *run_dir.parents]:
        if folder.resolve() not in MADE or any(folder.iterdir()):
            break
        folder.rmdir()
        MADE.discard(folder.resolve())
