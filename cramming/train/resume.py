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
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..engines import ENGINES, Engine
from ..errors import UserError
from ..renames import moved
from .state import TrainState, capture_rng, load_saved, refuse_unsafe, restore_rng

MARKER = "COMPLETE"
FINAL_SUMMARY = Path("checkpoint") / "train_summary.json"
# Keys that may change between a run and its resumption without changing what is trained.
RUNTIME_KEYS = {("train", "resume"), ("train", "checkpoint_every_minutes"), ("train", "keep_checkpoints"),
                ("impl", "num_workers"), ("impl", "compile"), ("impl", "compile_mode"), ("train", "log_every"),
                ("train", "tensorboard"), ("train", "wandb"), ("train", "wandb_project"), ("dryrun",), ("name",)}


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The whole checkpoints of one run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    found = [p for p in folder.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp") and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


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
                 engine: Engine | None = None, averaging=None):
        self.folder = Path(run_dir) / "checkpoints"
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
        tmp = final.with_name(final.name + ".tmp")
        if self.dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
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
                                                  "written_at": time.time()}))
            _fsync_tree(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)
            for old in complete_checkpoints(self.folder.parent)[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
            for stale in self.folder.glob("*.tmp"):  # left by a run killed while writing
                shutil.rmtree(stale, ignore_errors=True)
        self.dist.barrier()
        self.last_save = time.perf_counter()
        state.checkpoint_seconds += self.last_save - started
        return final

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
        restore_rng(load_saved(rng))
    else:  # resumed on more processes than wrote the checkpoint: the data and masks still continue exactly
        print(f"{path} has no random state for rank {engine.rank}; dropout draws start afresh", flush=True)
    return TrainState(**saved["state"])


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
        written_by = json.loads((Path(path) / MARKER).read_text()).get("world")
        if written_by != engine.world:
            raise UserError(f"{path} holds {engine.name}'s optimizer state in {written_by} partitions; resume "
                            f"it on {written_by} processes, not {engine.world}")


def load_weights(path: Path, model, optimizer, scaler, engine: Engine | None = None, averaging=None) -> dict:
    """Model, optimizer, scaler and the weight average (a rollback needs no more: the clock, data and RNG keep
    moving forward)."""
    engine = engine or Engine()
    saved = load_saved(Path(path) / "state.pt")
    check_written_alike(path, engine)
    engine.load_state(model, optimizer, path, saved)
    scaler.load_state_dict(saved["scaler"])
    if averaging is not None:
        averaging.load_state_dict(saved.get("averaging"), path)
    return saved


def config_differences(saved: dict, current: dict, prefix=()) -> list[str]:
    """Dotted keys whose values differ, ignoring RUNTIME_KEYS."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        path = (*prefix, key)
        if path in RUNTIME_KEYS:
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, path)
        elif a != b:
            diffs.append(".".join(path))
    return diffs


def resume_folder(value: str) -> Path:
    """train.resume=<folder>, checked before any work: it exists, it is whole, and its files load as tensors and
    plain data (state.refuse_unsafe)."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"train.resume={value}: no such folder; give one of a run's checkpoints/step-<n> folders, "
                        "or auto / never")
    if not (path / MARKER).is_file() or not (path / "state.pt").is_file():
        raise UserError(f"train.resume={value} is not a complete checkpoint folder (no {MARKER} marker or no "
                        "state.pt); give a checkpoints/step-<n> folder, or auto / never")
    for saved in [path / "state.pt", *sorted(path.glob("rng-*.pt"))]:
        refuse_unsafe(saved)
    return path


def find_resume(resume: str, run_dir: Path, config) -> Path | None:
    """train.resume: `never`; a checkpoint folder; or `auto`: the newest whole checkpoint of this run directory or
    of an unfinished sibling run of the same name (Hydra gives every launch a new folder) with the same config.
    The name is checked, not assumed from the layout: with a custom hydra.run.dir, runs of other names may sit
    side by side, and a different name never resumes."""
    current = json.loads(json.dumps(asdict(config)))  # tuples -> lists, as in the saved JSON
    if resume == "never":
        return None
    if resume != "auto":
        return resume_folder(resume)
    run_dir = Path(run_dir).resolve()
    runs = [run_dir] + sorted((p for p in run_dir.parent.iterdir() if p.is_dir() and p != run_dir),
                              key=lambda p: p.stat().st_mtime, reverse=True)
    for run in runs:
        if run != run_dir and (run / FINAL_SUMMARY).is_file():
            continue  # a finished run is not resumed
        found = complete_checkpoints(run)
        if not found:
            continue
        saved = moved(json.loads((found[-1] / "config.json").read_text()))  # written before options moved too
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
