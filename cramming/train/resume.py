"""Intermediate checkpoints and resuming from them.

A checkpoint is `checkpoints/step-<n>/` under the run directory: `state.pt` (model, optimizer, grad scaler,
every RNG state, the trainer's TrainState with the data position and elapsed budget) and `COMPLETE`, written
last. It is written into `step-<n>.tmp/`, flushed to disk and only then renamed, so a folder without the `.tmp`
suffix and with its marker is whole; anything else (a run killed mid-write) is ignored and cleaned up.
"""

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..errors import UserError
from .state import TrainState, capture_rng, restore_rng

MARKER = "COMPLETE"
FINAL_SUMMARY = Path("checkpoint") / "train_summary.json"
# Keys that may change between a run and its resumption without changing what is trained.
RUNTIME_KEYS = {("train", "resume"), ("train", "checkpoint_every_minutes"), ("train", "keep_checkpoints"),
                ("impl", "num_workers"), ("impl", "compile"), ("train", "log_every"), ("train", "tensorboard"),
                ("dryrun",), ("name",)}


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The whole checkpoints of one run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    found = [p for p in folder.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp") and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


def _fsync_tree(folder: Path) -> None:
    for path in [*folder.iterdir(), folder]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Checkpointer:
    def __init__(self, run_dir: Path, every_minutes: float | None, keep: int, config: dict):
        self.folder = Path(run_dir) / "checkpoints"
        self.every = None if every_minutes is None else every_minutes * 60
        self.keep, self.config = keep, config
        self.last_save = time.perf_counter()

    def due(self) -> bool:
        return self.every is not None and time.perf_counter() - self.last_save >= self.every

    def save(self, model, optimizer, scaler, state: TrainState, generator) -> Path | None:
        """Write a checkpoint, or return None without writing if any weight is not finite."""
        started = time.perf_counter()
        model = getattr(model, "_orig_mod", model)
        if not bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()):  # one sync
            return None
        final = self.folder / f"step-{state.step:08d}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                    "rng": capture_rng(generator), "state": state.to_dict(), "config": self.config}, tmp / "state.pt")
        (tmp / "config.json").write_text(json.dumps(self.config))  # read by find_resume without loading tensors
        (tmp / MARKER).write_text(json.dumps({"step": state.step, "written_at": time.time()}))
        _fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        for old in complete_checkpoints(self.folder.parent)[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.folder.glob("*.tmp"):  # left by a run killed while writing
            shutil.rmtree(stale, ignore_errors=True)
        self.last_save = time.perf_counter()
        state.checkpoint_seconds += self.last_save - started
        return final

    def latest(self) -> Path | None:
        found = complete_checkpoints(self.folder.parent)
        return found[-1] if found else None


def load_checkpoint(path: Path, model, optimizer, scaler, generator) -> TrainState:
    """Restore everything saved in `path` into the given objects; returns the trainer state."""
    saved = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)  # our own file
    getattr(model, "_orig_mod", model).load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    restore_rng(saved["rng"], generator)
    return TrainState(**saved["state"])


def load_weights(path: Path, model, optimizer, scaler) -> None:
    """A rollback: model, optimizer and scaler only; the clock, data position and RNG keep moving forward."""
    saved = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
    getattr(model, "_orig_mod", model).load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])


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


def find_resume(resume: str, run_dir: Path, config) -> Path | None:
    """train.resume: `never`; a checkpoint folder; or `auto`: the newest whole checkpoint of this run directory or
    of an unfinished sibling run of the same name (Hydra gives every launch a new folder) with the same config."""
    current = json.loads(json.dumps(asdict(config)))  # tuples -> lists, as in the saved JSON
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume).expanduser()
        if not (path / MARKER).is_file():
            raise UserError(f"train.resume={resume} is not a complete checkpoint folder (no {MARKER} marker); "
                            "give a checkpoints/step-<n> folder, or auto / never")
        return path
    run_dir = Path(run_dir).resolve()
    runs = [run_dir] + sorted((p for p in run_dir.parent.iterdir() if p.is_dir() and p != run_dir),
                              key=lambda p: p.stat().st_mtime, reverse=True)
    for run in runs:
        if run != run_dir and (run / FINAL_SUMMARY).is_file():
            continue  # a finished run is not resumed
        found = complete_checkpoints(run)
        if not found:
            continue
        diffs = config_differences(json.loads((found[-1] / "config.json").read_text()), current)
        if not diffs:
            return found[-1]
        print(f"not resuming from {found[-1]}: its config differs in {', '.join(diffs[:5])}", flush=True)
    return None
