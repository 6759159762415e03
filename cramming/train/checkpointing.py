"""Intermediate checkpoints and resuming from them.

A checkpoint is `checkpoints/step-<n>/` under the run directory: `state.pt` (model, optimizer, grad scaler, the
trainer's TrainState with the data position and elapsed budget), `rng-<rank>.pt` (every RNG state of each
process) and `COMPLETE`, written last. An engine with state of its own (FSDP2's shards, DeepSpeed's partitions)
writes it into its own sub-folder instead (Engine.state_folder). It is written into `step-<n>.tmp/`, flushed to disk and only
then renamed, so a folder without the `.tmp` suffix and with its marker is whole; anything else (a run killed
mid-write) is ignored and cleaned up.
"""

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..checkpoints.pickled import load_saved, refuse_unsafe
from ..checkpoints.step_folder import (
    FINAL_SUMMARY,
    MARKER,
    check_saved_sections,
    complete_checkpoints,
    config_differences,
    saved_config,
)
from ..engines import ENGINES, Engine
from ..errors import UserError
from ..outputs import remove, writing
from ..renames import moved
from ..untrusted import TOKENIZER_LIMIT, check_size, leads_outside, link_outside, plain_data, read_json
from .state import TrainState, capture_rng, restore_rng, rng_problem


def _fsync_tree(folder: Path) -> None:
    for path in [*folder.rglob("*"), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Checkpointer:
    """Writes and finds checkpoints. Distributed: every rank writes its RNG state (and the engine's own files, if
    it has any), and rank 0 alone writes the rest, the marker and the rename."""

    def __init__(self, run_dir: Path, every_minutes: float | None, keep: int, config: dict,
                 engine: Engine | None = None, averaging=None, precision: str | None = None):
        self.folder = Path(run_dir) / "checkpoints"
        self.precision = precision  # what the run trains in: its marker says it (impl.precision=auto's resume)
        self.every = None if every_minutes is None else every_minutes * 60
        self.keep, self.config = keep, config
        self.dist = engine or Engine()
        self.averaging = averaging  # train.averaging's state (averaging.py) goes into state.pt too
        self.tokenizer = None  # the run's tokenizer, saved in every checkpoint (train.init_from reads it there)
        self.last_save = time.perf_counter()

    def due(self) -> bool:
        return self.every is not None and time.perf_counter() - self.last_save >= self.every

    def save(self, model, optimizer, scaler, state: TrainState) -> Path | None:
        """Write a checkpoint, or return None without writing if any weight is not finite."""
        started = time.perf_counter()
        finite = torch.stack([torch.isfinite(p).all() for p in self.dist.unwrap(model).parameters()]).all()
        if self.dist.agree(not bool(finite), device=finite.device)[0]:  # one sync; any rank's shard counts
            return None
        final = self.folder / f"step-{state.step:08d}"
        tmp = final.with_name(final.name + ".tmp")  # the run's own folder (run_folder.py locks it): a fixed name
        with writing(self.folder, f"checkpoint {final.name}", made=[tmp] if self.dist.main else []):
            self._write(model, optimizer, scaler, state, tmp, final)
        self.last_save = time.perf_counter()
        state.checkpoint_seconds += self.last_save - started
        return final

    def _write(self, model, optimizer, scaler, state: TrainState, tmp: Path, final: Path) -> None:
        if self.dist.main:
            remove(tmp)  # a killed write's leftover (a link is removed, never what it points to)
            tmp.mkdir(parents=True)
        self.dist.barrier()
        saved = {"scaler": scaler.state_dict(), "state": state.to_dict(), "config": self.config}
        if self.averaging is not None:  # every rank averages the same whole weights: rank 0's copy is saved
            saved["averaging"] = self.averaging.state_dict()
        self.dist.save_state(model, optimizer, tmp, saved)
        if self.dist.main:
            torch.save(saved, tmp / "state.pt")
            (tmp / "config.json").write_text(json.dumps(self.config))  # read by find_resume, no tensors loaded
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(tmp / "tokenizer")
        torch.save(capture_rng(), tmp / f"rng-{self.dist.rank}.pt")
        self.dist.barrier()
        if self.dist.main:
            (tmp / MARKER).write_text(json.dumps({"step": state.step, "world": self.dist.world,
                                                  "precision": self.precision, "written_at": time.time()}))
            _fsync_tree(tmp)
            remove(final)
            os.rename(tmp, final)
            for old in complete_checkpoints(self.folder.parent)[:-self.keep]:
                remove(old)
            for stale in self.folder.glob("*.tmp"):  # left by a run killed while writing
                remove(stale)
        self.dist.barrier()

    def latest(self) -> Path | None:
        found = complete_checkpoints(self.folder.parent)
        return found[-1] if found else None


def load_checkpoint(path: Path, model, optimizer, scaler, engine: Engine | None = None,
                    averaging=None) -> TrainState:
    """Restore everything saved in `path` into the given objects; returns the trainer state."""
    engine = engine or Engine()
    saved = load_weights(path, model, optimizer, scaler, engine, averaging)
    rng = Path(path) / f"rng-{engine.rank}.pt"
    if rng.is_file():
        saved_rng = load_saved(rng)
        if problem := rng_problem(saved_rng):
            raise UserError(f"{rng}: {problem}; not a random state cramming wrote, so it was not restored")
        restore_rng(saved_rng)
    else:  # resumed on more processes than wrote the checkpoint: the data and masks still continue exactly
        print(f"{path} has no random state for rank {engine.rank}; dropout draws start afresh", flush=True)
    return TrainState.from_saved(saved["state"], Path(path) / "state.pt")


def check_written_alike(path: Path, engine: Engine) -> None:
    """A checkpoint resumes under the engine whose own files it holds (or, holding none, under one without)."""
    for name, kind in ENGINES.items():
        if kind.state_folder is None:
            continue
        written_with = (Path(path) / kind.state_folder).is_dir()
        if written_with != (engine.state_folder == kind.state_folder):
            raise UserError(f"{path} was written {'with' if written_with else 'without'} impl.distributed={name} "
                            "and must be resumed the same way")
    if ENGINES.trait(engine, "same_world_to_resume"):
        marker = read_json(Path(path) / MARKER, what="step folder marker")
        written_by = marker.get("world") if isinstance(marker, dict) else None
        if written_by != engine.world:
            raise UserError(f"{path} holds {engine.name}'s optimizer state in {written_by} partitions; resume "
                            f"it on {written_by} processes, not {engine.world}")


def load_weights(path: Path, model, optimizer, scaler, engine: Engine | None = None, averaging=None) -> dict:
    """Model, optimizer, scaler and the weight average (a rollback needs no more: the clock, data and RNG keep
    moving forward)."""
    engine = engine or Engine()
    saved = load_saved(Path(path) / "state.pt")
    check_saved_sections(saved, Path(path) / "state.pt")  # a newer cramming's sections and state: one line first
    TrainState.from_saved(saved.get("state"), Path(path) / "state.pt")
    check_written_alike(path, engine)
    try:
        engine.load_state(model, optimizer, path, saved)
        scaler.load_state_dict(saved["scaler"])
    except (RuntimeError, KeyError, ValueError, TypeError) as err:  # shapes, names: not this run's model
        first = (str(err).strip().splitlines() or [type(err).__name__])
        detail = next((line.strip() for line in first if "size mismatch" in line or "Missing" in line
                       or "Unexpected" in line), first[0].strip())
        raise UserError(f"{Path(path) / 'state.pt'} does not fit this run's model and optimizer "
                        f"({detail[:300]}); resume a step folder of this run's config") from None
    if averaging is not None:
        averaging.load_state_dict(saved.get("averaging"), path)
    return saved


def read_step(step: Path) -> tuple[dict, dict]:
    """A step folder's saved state and run config, read as data (export, train.init_from): a whole step folder,
    its files inside it, its tokenizer files of a tokenizer's size, its state plain data of this cramming's keys."""
    step = Path(step)
    if not (step / MARKER).is_file() or not (step / "state.pt").is_file():
        raise UserError(f"{step} is not a complete step folder (no {MARKER} and state.pt): give one of a run's "
                        "checkpoints/step-<n>/ folders")
    if not (step / "tokenizer").is_dir():
        raise UserError(f"{step} carries no tokenizer (written before step folders held one); the run's "
                        "checkpoint/ folder loads as it is")
    if (link := link_outside(step)) is not None or leads_outside(step, step / "tokenizer"):
        raise UserError(f"{step}: {link or step / 'tokenizer'} is a link leading outside the step folder; a step "
                        "folder's files must lie inside it, so it was not read")
    for path in (step / "tokenizer").iterdir():
        check_size(path, TOKENIZER_LIMIT, "tokenizer file")
    saved = load_saved(step / "state.pt")
    if "model" not in saved:
        raise UserError(f"{step} holds its weights in an engine's shards (FSDP2, DeepSpeed); resume the run "
                        "with one process (train.resume) and export a step it writes")
    check_saved_sections(saved, step / "state.pt")
    TrainState.from_saved(saved.get("state"), step / "state.pt")
    if not isinstance(saved.get("config"), dict):
        raise UserError(f"{step / 'state.pt'} holds no run config; not a step folder cramming wrote")
    plain_data(saved["config"], f"{step / 'state.pt'} config")
    return saved, moved(saved["config"])


def resume_folder(value: str, config=None) -> Path:
    """train.resume=<folder>, checked before any work: it exists, it is whole, its files load as tensors and plain
    data (pickled.refuse_unsafe), and it was trained with this run's model and data options (else its tensors
    would not fit this run's)."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"train.resume={value}: no such folder; give one of a run's checkpoints/step-<n> folders, "
                        "or auto / never")
    if not (path / MARKER).is_file() or not (path / "state.pt").is_file():
        raise UserError(f"train.resume={value} is not a complete checkpoint folder (no {MARKER} marker or no "
                        "state.pt); give a checkpoints/step-<n> folder, or auto / never")
    if (link := next((p for p in path.iterdir() if leads_outside(path, p)), None)) is not None:
        raise UserError(f"train.resume={value}: {link} is a link leading outside the step folder; a step folder's "
                        "files must lie inside it, so it was not read")
    for saved in [path / "state.pt", *sorted(path.glob("rng-*.pt"))]:
        refuse_unsafe(saved)
    if config is not None and (path / "config.json").is_file():
        current = json.loads(json.dumps(asdict(config)))
        shaped = [d for d in config_differences(saved_config(path, current), current)
                  if d.startswith("arch.") or d == "data.vocab_size"]
        if shaped:
            raise UserError(f"train.resume={value} was trained with other model or data options ({', '.join(shaped[:5])}); "
                            "its tensors would not fit this run: resume it with the config it was trained with")
    return path


def find_resume(resume: str, run_dir: Path, config) -> Path | None:
    """train.resume: `never`; a checkpoint folder; or `auto`: the newest whole checkpoint of this run directory or
    of an unfinished sibling run of the same name (Hydra gives every launch a new folder) with the same config.
    The name is checked, not assumed from the layout: with a custom hydra.run.dir, runs of other names may sit
    side by side, and a different name never resumes. Sibling folders are someone's data: one that cannot be read
    (a link leading out, a config that is not a run's) is skipped, and said so."""
    current = json.loads(json.dumps(asdict(config)))  # tuples -> lists, as in the saved JSON
    if resume == "never":
        return None
    if resume != "auto":
        return resume_folder(resume, config)
    run_dir = Path(run_dir).resolve()
    siblings = [p for p in run_dir.parent.iterdir() if p.is_dir() and not p.is_symlink() and p != run_dir]
    runs = [run_dir] + sorted(siblings, key=lambda p: p.stat().st_mtime, reverse=True)
    for run in runs:
        if run != run_dir and (run / FINAL_SUMMARY).is_file():
            continue  # a finished run is not resumed
        found = complete_checkpoints(run)
        if not found:
            continue
        try:
            saved = saved_config(found[-1], current)
        except (UserError, OSError) as err:
            print(f"not resuming from {found[-1]}: {err}", flush=True)
            continue
        if saved.get("name") != config.name:
            if run == run_dir:
                print(f"not resuming from {found[-1]}: it belongs to run name={saved.get('name')!r}, this is "
                      f"name={config.name!r}", flush=True)
            continue
        diffs = config_differences(saved, current)
        if not diffs:
            return found[-1]
        print(f"not resuming from {found[-1]}: its config differs in {', '.join(diffs[:5])}", flush=True)
    return None
