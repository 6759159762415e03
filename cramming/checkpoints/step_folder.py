"""A step folder's format: `checkpoints/step-<n>/` under a run folder, whole when it holds its `COMPLETE`
marker (written last, with the step, the world size and the precision the run trained in), `state.pt` (the sections
below), `rng-<rank>.pt`, `config.json` (the run's config) and `tokenizer/`. Written by train/checkpointing.py's
Checkpointer; read here by whoever needs to know what a step folder holds without training (resume, export, eval's
refusal of a step folder given as a checkpoint)."""

import re
from pathlib import Path

from ..errors import UserError
from ..renames import moved
from ..untrusted import leads_outside, plain_data, read_json

MARKER = "COMPLETE"
FINAL_SUMMARY = Path("checkpoint") / "train_summary.json"
# Keys that may change between a run and its resumption without changing what is trained.
RUNTIME_KEYS = {("train", "resume"), ("train", "checkpoint_every_minutes"), ("train", "keep_checkpoints"),
                ("impl", "num_workers"), ("impl", "compile"), ("impl", "compile_mode"), ("train", "log_every"),
                ("train", "tensorboard"), ("train", "wandb"), ("train", "wandb_project"), ("dryrun",), ("name",)}


STEP_NAME = re.compile(r"step-(\d+)")


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The whole checkpoints of one run, oldest first: folders named step-<n> inside it with their marker (anything
    else there, a link leading out of the run folder included, is not one of its checkpoints)."""
    folder = Path(run_dir) / "checkpoints"
    found = [p for p in folder.glob("step-*") if STEP_NAME.fullmatch(p.name) and p.is_dir()
             and not leads_outside(run_dir, p) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


def saved_precision(step: Path, device_type: str) -> str | None:
    """The precision a step folder trained in: its marker's; for one written before markers said it, what
    impl.precision=auto chose then (fp32 on CPUs; on GPUs the choice has not changed: None, keep this run's)."""
    marker = read_json(Path(step) / MARKER, what="step folder marker")
    value = marker.get("precision") if isinstance(marker, dict) else None
    if value in ("fp32", "bf16", "fp16"):
        return value
    return "fp32" if device_type == "cpu" else None


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


# What a Checkpointer writes into state.pt (an engine with files of its own leaves out "model" and "optimizer").
SECTIONS = {"model", "optimizer", "scaler", "state", "config", "averaging"}


def check_saved_sections(saved: dict, path: Path) -> None:
    """A state.pt holds the sections a Checkpointer writes and no others (a newer cramming's would be ignored)."""
    unknown = sorted(str(k) for k in set(saved) - SECTIONS)
    if unknown:
        raise UserError(f"{path}: holds sections this cramming does not know ({', '.join(unknown[:3])}); a newer "
                        "cramming wrote it: use that version")


def saved_config(step: Path, current: dict | None = None) -> dict:
    """A step folder's config.json (the run's config, as saved): plain data, with keys moved since moved; with
    `current` (this run's config as plain data), an option it does not have is one line: a newer cramming wrote it,
    and this one could not honour it."""
    saved = read_json(step / "config.json", what="step folder config")
    if not isinstance(saved, dict):
        raise UserError(f"{step / 'config.json'}: a run config is a JSON object, this holds a {type(saved).__name__}")
    plain_data(saved, str(step / "config.json"))
    saved = moved(saved)  # written before options moved too
    if current is not None and (unknown := unknown_keys(saved, current)):
        raise UserError(f"{step / 'config.json'}: has options this cramming does not know ({', '.join(unknown[:3])}); "
                        "a newer cramming wrote it: resume it with that version")
    return saved


def unknown_keys(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Dotted keys of `saved` that the schema (`current`, a whole config) has not; free-form tables are skipped."""
    found = []
    for key, value in saved.items():
        if key not in current:
            found.append(f"{prefix}{key}")
        elif isinstance(value, dict) and isinstance(current[key], dict) and current[key]:
            found += unknown_keys(value, current[key], f"{prefix}{key}.")
    return found
