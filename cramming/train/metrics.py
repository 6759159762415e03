"""Per-step metrics: one JSON object per line in metrics.jsonl, flushed each line so a crash loses nothing.
The same scalars can also go to TensorBoard (`train.tensorboard`) and Weights & Biases (`train.wandb`)."""

import json
from dataclasses import asdict
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from ..errors import UserError
from ..outputs import writing
from ..untrusted import text_lines


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool = False, wandb: dict | None = None):
        """`wandb`: wandb.init's arguments (mode, project, name, group, config), or None for no W&B."""
        self.folder = run_dir = Path(run_dir)
        self.wandb = start_wandb(run_dir, **wandb) if wandb else None  # first: it is the one that can fail
        with writing(run_dir, "metrics.jsonl"):
            self.file = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` package

            self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    @classmethod
    def for_run(cls, run_dir: Path, config) -> "MetricsLog":
        """The log of a pretraining run: metrics.jsonl, plus TensorBoard and W&B as `config.train` asks."""
        wandb = None
        if config.train.wandb != "off":
            name, group = wandb_names(config.name, run_dir)
            wandb = {"mode": config.train.wandb, "project": config.train.wandb_project, "name": name,
                     "group": group, "config": asdict(config)}
        return cls(run_dir, config.train.tensorboard, wandb)

    def log(self, record: dict) -> None:
        with writing(self.folder, "metrics.jsonl"):  # a full disk: one line, the last checkpoint still whole
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float))}
        if self.writer is not None:
            for key, value in scalars.items():
                if key != "step":
                    self.writer.add_scalar(key, value, record.get("step", 0))
        if self.wandb is not None:
            self.wandb.log(scalars)  # `step` is a metric: W&B's own step must only grow, ours goes back on rollback

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def wandb_names(name: str, run_dir: Path) -> tuple[str, str | None]:
    """W&B's run name and group: the config name for a single run; in a sweep `<name>/<job folder>`, grouped by
    sweep as `<name>/<sweep folder>`, so a sweep's jobs sit together and tell themselves apart."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return f"{name}/{Path(run_dir).name}", f"{name}/{Path(HydraConfig.get().sweep.dir).name}"
    return name, None


def start_wandb(run_dir: Path, mode: str, project: str, name: str, group: str | None, config: dict):
    """A W&B run writing under `<run>/wandb`. Offline never touches the network (`wandb sync` uploads later).
    Quiet, and without console capture, so the run's own output keeps its one-line contracts."""
    import wandb  # the optional `wandb` package (checked by the config): only with train.wandb

    try:
        run = wandb.init(mode=mode, project=project, name=name, group=group, config=config, dir=str(run_dir),
                         settings=wandb.Settings(silent=True, console="off"))
    except Exception as err:  # noqa: BLE001  online without a login, an unreachable server, ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"train.wandb={mode}: W&B did not start ({first}); log in with `wandb login` or "
                        "WANDB_API_KEY, or use train.wandb=offline and `wandb sync` later") from None
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    folder = Path(run.dir).parent  # run.dir is the run's files/ folder
    where = f"{folder}; upload with: wandb sync {folder}" if mode == "offline" else run.url
    print(f"wandb: {mode} run {name} ({where})", flush=True)
    return run


def whole_lines(path: Path) -> list[str]:
    """The lines of a metrics.jsonl, each a JSON object whose step (where it has one) is a whole number. A run killed
    mid-write can leave a torn last line: it is dropped (the step it logged is logged again when the run resumes);
    a broken line anywhere else is the user's to look at."""
    lines = [line.rstrip("\r\n") for line in text_lines(path)]
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                return lines[:-1]
            record = None
        except (RecursionError, ValueError):
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("step", 0), int):
            raise UserError(f"{path}: line {number} of {len(lines)} is not a metrics record ({line[:60]!r}); delete "
                            "that line to resume, or start afresh with train.resume=never")
    return lines


class SilentLog:
    """The log of every rank but 0: only rank 0 writes metrics."""

    def log(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass
