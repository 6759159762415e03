"""train.averaging: weights averaged over the run, saved beside the last ones as `<run>/final-<kind>/`.

- `ema`: an fp32 shadow of the weights, `shadow = decay * shadow + (1 - decay) * weights` after each applied
  optimizer step (torch.optim.swa_utils' EMA update); it starts as the weights after the first step, as
  torch's AveragedModel does.
- `lawa` (Kaddour 2022, "Stop wasting my time!"): the uniform mean of the latest `train.lawa.k` snapshots, one
  taken each time the budget fraction passes another multiple of `train.lawa.every_fraction`, and the final
  weights as the newest. Snapshots wait on the CPU, so they cost no GPU memory.

The averaging state goes into every resume checkpoint (state.pt) and comes back bit for bit. It averages the
parameters each process holds whole: one process or DDP (every rank holds the same replica and the same average);
FSDP2's shards and DeepSpeed's ZeRO partitions are refused by `problem`.
"""

import contextlib

import torch
from torch.optim.swa_utils import get_ema_multi_avg_fn

from ..config import TrainConfig
from ..engines import ENGINES
from ..model.configuration_crammed import current_key
from ..registry import Registry
from .hooks import Hook

AVERAGING = Registry("train.averaging")
AVERAGING.serves(TrainConfig, "averaging")
AVERAGING.register("none", about="No averaging: the last weights are the run's only ones.")(None)


class Averager(Hook):
    """What ema and lawa share: the parameters they follow (the unwrapped model's, in named order), the swap
    that puts the average into the model for validation and the final checkpoint, and the resume state. The loop
    calls it as a hook (hooks.py): an update after each applied step, a restore after a rollback."""

    name = ""

    @classmethod
    def problem(cls, config) -> str | None:
        """What train.averaging refuses (config.validate asks the chosen kind): engines whose processes hold only
        parts of the weights (Engine.shards_weights)."""
        if ENGINES.trait(config.impl.distributed, "shards_weights"):
            return (f"train.averaging={cls.name} cannot run under impl.distributed={config.impl.distributed}: each "
                    "process holds only part of the weights there; use impl.distributed="
                    f"{ENGINES.choices('shards_weights', has=False)}, or train.averaging=none")
        return None

    def __init__(self, cfg, model):
        named = list(model.named_parameters())
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]

    @property
    def folder(self) -> str:
        return f"final-{self.name}"

    def update(self, step: int, fraction: float) -> None:
        """After each applied optimizer step; `fraction` is the budget fraction all ranks agree on."""
        raise NotImplementedError

    def on_step(self, trainer, state) -> None:  # the fraction from the clock all ranks agreed on last
        self.update(state.step, trainer.budget.fraction(state.elapsed, state.step))

    def on_rollback(self, saved: dict, path) -> None:
        self.load_state_dict(saved.get("averaging"), path)

    def finish(self, step: int) -> None:
        """Once training is over, before the average is used."""

    def averaged(self) -> list[torch.Tensor]:
        raise NotImplementedError

    @contextlib.contextmanager
    @torch.no_grad()
    def swapped_in(self):
        """The model holds the averaged weights inside the block and its own weights again after it."""
        live = [p.detach().clone() for p in self.params]
        for param, value in zip(self.params, self.averaged()):
            param.copy_(value)
        try:
            yield
        finally:
            for param, value in zip(self.params, live):
                param.copy_(value)

    def state_dict(self) -> dict:
        return {"kind": self.name, "names": self.names}

    def load_state_dict(self, saved: dict | None, where) -> None:
        """Restore `saved` (from a checkpoint), or start afresh, saying so, when it holds no average of this kind
        for these parameters (a checkpoint written with another train.averaging, given as train.resume)."""
        names = [current_key(n) for n in saved.get("names", [])] if saved else None  # saved before a rename too
        if saved is None or saved.get("kind") != self.name or names != self.names:
            print(f"{where} holds no {self.name} average of this model; train.averaging={self.name} starts "
                  "afresh from here", flush=True)
            return
        self.restore(saved)

    def restore(self, saved: dict) -> None:
        raise NotImplementedError


@AVERAGING.register("ema")
class EMA(Averager):
    """An exponential moving average of the weights after each applied step (train.ema.decay)."""

    name = "ema"

    def __init__(self, cfg, model):
        super().__init__(cfg, model)
        self.decay = cfg.ema.decay
        self.shadow = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]  # on the weights' device
        self.updates = 0
        self.lerp = get_ema_multi_avg_fn(self.decay)

    @torch.no_grad()
    def update(self, step: int, fraction: float) -> None:
        weights = [p.detach().float() for p in self.params]
        if self.updates == 0:
            torch._foreach_copy_(self.shadow, weights)
        else:
            self.lerp(self.shadow, weights, self.updates)
        self.updates += 1

    def averaged(self) -> list[torch.Tensor]:
        return self.shadow

    def describe(self) -> dict:
        return {"kind": self.name, "decay": self.decay, "updates": self.updates}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "shadow": [t.cpu() for t in self.shadow], "updates": self.updates}

    def restore(self, saved: dict) -> None:
        for mine, value in zip(self.shadow, saved["shadow"]):
            mine.copy_(value)
        self.updates = saved["updates"]


@AVERAGING.register("lawa")
class LAWA(Averager):
    """The mean of the latest train.lawa.k snapshots taken across the budget (Kaddour 2022)."""

    name = "lawa"

    def __init__(self, cfg, model):
        super().__init__(cfg, model)
        self.k, self.every = cfg.lawa.k, cfg.lawa.every_fraction
        self.snapshots: list[tuple[int, list[torch.Tensor]]] = []  # (step, fp32 CPU weights), oldest first
        self.passed = 0  # multiples of lawa.every_fraction the run had passed at the last update

    def update(self, step: int, fraction: float) -> None:
        passed = int(fraction / self.every + 1e-9)  # 1.0 / 0.05 is 19.999... in floating point
        if passed > self.passed:
            self.passed = passed
            self.take(step)

    def finish(self, step: int) -> None:
        if not self.snapshots or self.snapshots[-1][0] != step:
            self.take(step)  # the final weights are the newest snapshot

    @torch.no_grad()
    def take(self, step: int) -> None:
        self.snapshots.append((step, [p.detach().to("cpu", torch.float32, copy=True) for p in self.params]))
        del self.snapshots[:-self.k]

    def averaged(self) -> list[torch.Tensor]:
        return [torch.stack(values).mean(0) for values in zip(*(weights for _, weights in self.snapshots))]

    def describe(self) -> dict:
        return {"kind": self.name, "k": self.k, "every_fraction": self.every,
                "snapshot_steps": [step for step, _ in self.snapshots]}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "snapshots": self.snapshots, "passed": self.passed}

    def restore(self, saved: dict) -> None:
        self.snapshots = [(step, [t.clone() for t in weights]) for step, weights in saved["snapshots"]]
        self.passed = saved["passed"]


def build_averaging(cfg, model) -> Averager | None:
    """The averager train.averaging names, following the unwrapped model's parameters; None for none."""
    kind = AVERAGING.get_or_explain(cfg.averaging)
    return kind(cfg, model) if kind is not None else None


def average_final(averaging: Averager, step: int, model, engine, measure, rebuild) -> tuple[dict, object]:
    """The averaged weights' validation metrics and, on rank 0, a whole model holding them (None elsewhere).
    Every rank calls it (the validation and an engine's gathering are collective)."""
    averaging.finish(step)
    with averaging.swapped_in():
        metrics = measure()
        whole = engine.whole_model(model, rebuild)
        if engine.main and whole is engine.unwrap(model):  # the live module: copy it, its own weights come back after this
            whole = rebuild({k: v.detach().cpu().clone() for k, v in whole.state_dict().items()})
    return metrics, whole if engine.main else None
