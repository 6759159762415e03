"""What pretrain.py adds around a run when it is one job of a sweep, or asked to evaluate itself.

- `eval_after=true`: GLUE (or a custom task, any subset) on the fresh checkpoint. Its config is composed from
  eval.yaml plus `eval_overrides` and checked, task data included, before any training, so a typo cannot waste
  the budget. Results go to `<run>/eval/results.json`.
- `sweep_objective`: what the run returns to a Hydra sweeper (Optuna minimises or maximises it): the final
  validation loss, or the GLUE average of the pretrained model (needs eval_after).
- In a multirun, each job records itself in `<sweep dir>/manifest.json` (job number, folder, overrides,
  status and objective), under a file lock, so parallel launchers can share it.
"""

import fcntl
import json
import os
from dataclasses import replace
from pathlib import Path

from .errors import UserError


def eval_after_config(config):
    """The eval.py config for eval_after, composed and fully checked now; None when eval_after is off."""
    if not config.eval_after:
        if config.sweep_objective == "glue_average":
            raise UserError("sweep_objective=glue_average needs eval_after=true")
        return None
    from hydra import compose
    from hydra.errors import HydraException

    from .eval.config import load_eval_config
    from .evaluation import load_tasks

    try:
        cfg = compose(config_name="eval", overrides=[f"checkpoint={os.devnull}", *config.eval_overrides])
    except HydraException as err:
        raise UserError(f"eval_overrides: {str(err).splitlines()[0]}") from None
    eval_config = load_eval_config(cfg)
    load_tasks(eval_config)  # reads and checks every task's files now
    return eval_config


def evaluate_after(eval_config, checkpoint: Path, run_dir: Path) -> dict:
    from .evaluation import evaluate

    path = evaluate(replace(eval_config, checkpoint=str(checkpoint)), Path(run_dir) / "eval")
    return json.loads(Path(path).read_text())


def objective_value(config, summary: dict, results: dict | None) -> float:
    if config.sweep_objective == "glue_average":
        glue = results["models"]["pretrained"].get("glue") or {}
        if "average" not in glue:
            raise UserError("sweep_objective=glue_average: the evaluation gave no GLUE average (eval.kind=custom?)")
        return float(glue["average"])
    return float(summary.get("val_loss", 0.0))


def record_job(sweep_dir: Path, job: int, run_dir: Path, overrides: list[str], **fields) -> None:
    """Add or update this job's entry in the sweep's manifest.json."""
    path = Path(sweep_dir) / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        jobs = json.loads(path.read_text())["jobs"] if path.is_file() else []
        jobs = [j for j in jobs if j["job"] != job]
        jobs.append({"job": job, "dir": str(Path(run_dir).resolve()), "overrides": list(overrides), **fields})
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"jobs": sorted(jobs, key=lambda j: j["job"])}, indent=1))
        os.replace(tmp, path)


SWEEP_FUNCTIONS = ("choice(", "range(", "interval(", "glob(", "tag(")


def is_swept(value: str) -> bool:
    """A Hydra override value that expands to several jobs: a top-level comma, or a sweep function."""
    if value.startswith(SWEEP_FUNCTIONS):
        return True
    depth, quote = 0, None
    for char in value:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return False


def name_jobs_by_swept_keys(argv: list[str]) -> list[str]:
    """In a multirun, job folders are named by the swept keys only (`3_arch.position=rotary,train.lr=0.002`):
    the fixed overrides are the same for every job and would make names too long for the file system."""
    if not {"-m", "--multirun"} & set(argv) or any("override_dirname.exclude_keys" in a for a in argv):
        return argv
    fixed = [a.split("=", 1)[0].lstrip("+~") for a in argv[1:]
             if "=" in a and not a.startswith(("hydra.", "hydra/")) and not is_swept(a.split("=", 1)[1])]
    # beside the other overrides: argparse takes them as one run of positional arguments, flags around them
    position = next((i for i, a in enumerate(argv) if i and "=" in a and not a.startswith("-")), len(argv))
    exclude = f"hydra.job.config.override_dirname.exclude_keys=[{','.join(['name', *fixed])}]"
    return [*argv[:position], exclude, *argv[position:]]
