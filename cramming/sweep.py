"""What pretrain.py adds around a run when it is one job of a sweep, or asked to evaluate itself.

- `eval_after=true`: GLUE (or a custom task, any subset) on the fresh checkpoint. Its config is composed from
  eval.yaml plus `eval_overrides` and checked, task data included, before any training, so a typo cannot waste
  the budget. Results go to `<run>/eval/results.json`.
  With train.averaging on, the averaged weights (`<run>/final-<kind>/`) are evaluated too, into
  `<run>/eval-<kind>/results.json`.
- `sweep_objective`: what the run returns to a Hydra sweeper (Optuna minimises or maximises it): the final
  validation loss, or the GLUE average of the pretrained model (needs eval_after). With train.averaging on it
  is the averaged weights' (the model that option is for; the last weights' numbers stay in the summary and
  eval/), as the run's line about the averaged weights says.
- In a multirun, each job records itself in `<sweep dir>/manifest.json` (job number, folder, overrides,
  status and objective; for a failed job its one-line error and log), under a file lock, so parallel launchers
  can share it.
- One failing job does not end a sweep (`sweep_job`); the sweep's exit code and last line say which failed
  (`SweepOutcome`).
"""

import functools
import json
import logging
import math
import os
import sys
import traceback
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from hydra import compose
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from .atomic import locked, write_atomic
from .errors import EXIT_UNEXPECTED, RunStopped, UserError, exit_on_user_error, failure_line
from .eval.config import EvalConfig
from .renames import renamed_override
from .run_folder import stop
from .train.signals import EXIT_PREEMPTED
from .untrusted import read_json as read_untrusted_json

EXIT_SWEEP_FAILED = 1  # a multirun in which at least one job failed


def eval_after_config(config):
    """The eval.py config for eval_after, composed and fully checked now; None when eval_after is off."""
    if not config.eval_after:
        if config.sweep_objective == "glue_average":
            raise UserError("sweep_objective=glue_average needs eval_after=true")
        return None
    from .eval.recipe import load_tasks  # heavy (torch, transformers): only with eval_after
    from .validation.eval import load_eval_config  # heavy (every component): the same

    if line := renamed_override(config.eval_overrides):
        raise UserError(f"eval_overrides: {line}")
    try:
        cfg = compose(config_name="eval", overrides=[f"checkpoint={os.devnull}", *config.eval_overrides])
    except HydraException as err:
        raise UserError(f"eval_overrides: {str(err).splitlines()[0]}") from None
    eval_config = load_eval_config(cfg)
    _, skipped = load_tasks(eval_config)  # reads and checks every task's files now
    if config.sweep_objective == "glue_average" and (partial := partial_glue(eval_config.eval, skipped)):
        raise UserError(f"sweep_objective=glue_average needs the whole GLUE set, each task on all its data, and "
                        f"this evaluation is partial ({partial}): change eval_overrides, or use sweep_objective=val_loss")
    return eval_config


def partial_glue(settings, skipped: dict) -> str | None:
    """Why an evaluation's GLUE average is not the full one (a partial average ranks trials on another scale)."""
    if settings.kind != "glue":
        return f"eval.kind={settings.kind}"
    left_out = [task for task in EvalConfig().tasks if task not in settings.tasks]
    reasons = [f"skipped {', '.join(skipped)}"] if skipped else []
    if left_out:
        reasons.append(f"eval.tasks leaves out {', '.join(left_out)}")
    if settings.max_train_examples is not None:
        reasons.append(f"eval.max_train_examples={settings.max_train_examples}")
    return "; ".join(reasons) or None


def evaluate_after(eval_config, checkpoint: Path | None, run_dir: Path) -> dict | None:
    """None for a dryrun (no checkpoint): eval_after_config has checked the evaluation, nothing is evaluated.
    The last weights' results, with the averaged weights' (train.averaging) under `averaged`."""
    if checkpoint is None:
        return None
    from .eval.recipe import evaluate  # heavy (torch, transformers): only with eval_after

    path = evaluate(replace(eval_config, checkpoint=str(checkpoint)), Path(run_dir) / "eval")
    results = json.loads(Path(path).read_text())
    averaging = (read_json(Path(run_dir) / "train_summary.json") or {}).get("averaging")
    if averaging:
        path = evaluate(replace(eval_config, checkpoint=averaging["checkpoint"]),
                        Path(run_dir) / f"eval-{averaging['kind']}")
        results["averaged"] = json.loads(Path(path).read_text())
    return results


def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def objective_value(config, summary: dict, results: dict | None) -> float | None:
    """What the sweeper gets; a value that is missing or not comparable fails the trial (raises) rather than
    ranking it: 0.0 would be the best loss a minimiser ever saw. A dryrun trained nothing: None. With
    train.averaging on, the averaged weights' value (pretraining's line about them says so)."""
    if summary.get("dryrun"):
        return None
    averaging = summary.get("averaging")
    if averaging:
        summary = {**summary, "val_loss": averaging.get("val_loss")}
        results = (results or {}).get("averaged") if config.sweep_objective == "glue_average" else results
    return objective_of(config.sweep_objective, summary, results)


def objective_of(objective: str, summary: dict, results: dict | None) -> float:
    if objective == "glue_average":
        glue = (results or {}).get("models", {}).get("pretrained", {}).get("glue") or {}
        average = glue.get("average")
        if average is None or not math.isfinite(average) or not results.get("comparable") or results.get("skipped"):
            raise UserError(f"sweep_objective=glue_average: no comparable GLUE average (average {average}, "
                            f"comparable {(results or {}).get('comparable')}); the trial counts as failed")
        return float(average)
    loss = summary.get("val_loss")
    if loss is None or not math.isfinite(loss):
        raise UserError(f"sweep_objective=val_loss: the run reported no finite validation loss (val_loss={loss}); "
                        "the trial counts as failed")
    return float(loss)


def record_job(sweep_dir: Path, job: int, run_dir: Path, overrides: list[str], **fields) -> None:
    """Add or update this job's entry in the sweep's manifest.json. `updated` tells SweepOutcome which entries
    this launch wrote (a sweep continued in the same folder keeps the earlier launch's others)."""
    path = Path(sweep_dir) / "manifest.json"
    with locked(path):
        jobs = [j for j in read_manifest(sweep_dir) if j["job"] != job]
        jobs.append({"job": job, "dir": str(Path(run_dir).resolve()), "overrides": list(overrides), **fields,
                     "updated": datetime.now(timezone.utc).isoformat()})
        write_atomic(path, json.dumps({"jobs": sorted(jobs, key=lambda j: j["job"])}, indent=1))


def read_manifest(sweep_dir) -> list[dict]:
    """The manifest's job entries; a sweep folder continued in place is data someone may have changed, so a manifest
    that is not one (or an entry without a job number) is one line naming it."""
    path = Path(sweep_dir) / "manifest.json"
    if not path.is_file():
        return []
    manifest = read_untrusted_json(path, what="sweep manifest")
    jobs = manifest.get("jobs") if isinstance(manifest, dict) else None
    if not isinstance(jobs, list) or not all(isinstance(j, dict) and isinstance(j.get("job"), int) for j in jobs):
        raise UserError(f"{path}: not a sweep manifest (a list of jobs, each with its number); move it away to "
                        "continue the sweep in this folder, or give hydra.sweep.dir a new folder")
    return jobs


def sweep_job(fn):
    """Wrap pretrain.py's task function. Alone, a run keeps exit_on_user_error's contract (one line, exit 2 or
    the documented code). In a multirun one failing job must not end the sweep, and in Hydra 1.3 it would: the
    SystemExit that exit_on_user_error raises escapes run_job (which catches only Exception) and ends the process;
    an exception run_job does catch is re-raised by the basic sweeper once its batch is done (with a traceback),
    and Optuna's sweeper ends the study on it (max_failure_rate=0). So a failing job prints its one line,
    records itself as failed in manifest.json (the traceback of an unexpected exception goes to the job's log)
    and returns None: the basic sweeper ignores return values, and Optuna's sweeper tells the trial FAIL (None
    is not a float) and asks for the next one. A NaN would not do: optuna 2.10 refuses a NaN value and the
    plugin's FAIL fallback then re-raises. SweepOutcome gives the sweep its non-zero exit at the end.
    A stop signal (Ctrl-C, a preempted node) is meant for the whole sweep: it still ends it, with code 75."""
    alone = exit_on_user_error(fn)

    @functools.wraps(fn)
    def wrapper(cfg):
        hydra_cfg = HydraConfig.get()
        if hydra_cfg.mode != RunMode.MULTIRUN:
            return alone(cfg)
        job = {"sweep_dir": hydra_cfg.sweep.dir, "job": hydra_cfg.job.num, "run_dir": hydra_cfg.runtime.output_dir,
               "overrides": list(hydra_cfg.overrides.task)}
        record_job(**job, status="running")  # first: a job whose config is rejected is in the manifest too
        try:
            value = fn(cfg)
        except Exception as err:  # noqa: BLE001  any failure is this job's, not the sweep's
            line, code = failure_line(err)
            log = log_failure(line, err, with_traceback=code == EXIT_UNEXPECTED)
            if code == EXIT_UNEXPECTED and log:
                line += f" (traceback in {log})"
            print(line, file=sys.stderr, flush=True)
            stopped = isinstance(err, RunStopped) and code == EXIT_PREEMPTED
            record_job(**job, status="stopped" if stopped else "failed", error=line, exit_code=code, log=log)
            if stopped:
                sys.exit(code)
            return None
        except BaseException:  # KeyboardInterrupt, SystemExit: they end the sweep, as they should
            record_job(**job, status="stopped")
            raise
        record_job(**job, status="finished", objective=value)
        return value

    return wrapper


def log_failure(line: str, err: BaseException, with_traceback: bool) -> str | None:
    """Write a job's failure to its log file (Hydra's `<job dir>/<task name>.log`, the root logger's file
    handlers only, so the console keeps one line) and return that file; with no log file, an unexpected
    error's traceback goes to stderr instead."""
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    if not files:
        if with_traceback:
            traceback.print_exception(err)
        return None
    exc_info = (type(err), err, err.__traceback__) if with_traceback else None
    record = logging.LogRecord("cramming", logging.ERROR, __file__, 0, line, None, exc_info)
    for handler in files:
        handler.handle(record)
    return files[0].baseFilename


class SweepOutcome(Callback):
    """A Hydra callback (conf/pretrain.yaml): when a multirun ends, one line naming the jobs that failed and
    their logs, and exit code 1, so a script or CI sees a sweep with failures. It reads manifest.json, so it sees
    jobs whatever the launcher; entries not written since the sweep started (an earlier launch's, when a sweep
    is continued in the same folder) do not count."""

    def __init__(self):
        self.before: dict[int, str | None] = {}

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            self.before = {j["job"]: j.get("updated") for j in read_manifest(config.hydra.sweep.dir)}
        except UserError as err:  # before any job: Hydra would only warn of an exception from a callback
            stop(str(err))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        jobs = [j for j in read_manifest(sweep_dir) if j.get("updated") != self.before.get(j["job"], "")]
        failed = [j for j in jobs if j["status"] != "finished"]
        if failed:
            where = ", ".join(f"#{j['job']} {j.get('log') or j['dir']}" for j in failed)
            print(f"error: {len(failed)} of {len(jobs)} sweep jobs failed: {where} "
                  f"(statuses: {sweep_dir / 'manifest.json'})", file=sys.stderr, flush=True)
            sys.exit(EXIT_SWEEP_FAILED)


def fixed_keys(overrides: list[str]) -> list[str]:
    """The keys that every job of a sweep sets the same way, hydra's own left out. An override Hydra cannot
    parse is left to Hydra, which then reports it in its own words."""
    parser = OverridesParser.create()
    keys = []
    for line in overrides:
        try:
            override = parser.parse_override(line)
        except HydraException:
            continue
        if not override.is_hydra_override() and not override.is_sweep_override():
            keys.append(override.key_or_group)  # what Hydra compares with override_dirname.exclude_keys
    return keys


def name_jobs_by_swept_keys(argv: list[str]) -> list[str]:
    """In a multirun, job folders are named by the swept keys only (`3_arch.position=rotary,train.lr=0.002`):
    the fixed overrides are the same for every job and would make names too long for the file system."""
    if not {"-m", "--multirun"} & set(argv) or any("override_dirname.exclude_keys" in a for a in argv):
        return argv
    fixed = fixed_keys([a for a in argv[1:] if "=" in a and not a.startswith("-")])
    # beside the other overrides: argparse takes them as one run of positional arguments, flags around them
    position = next((i for i, a in enumerate(argv) if i and "=" in a and not a.startswith("-")), len(argv))
    exclude = f"hydra.job.config.override_dirname.exclude_keys=[{','.join(['name', *fixed])}]"
    return [*argv[:position], exclude, *argv[position:]]
