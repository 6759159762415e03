"""train.nonfinite: what the loop does with an optimizer step whose loss or gradient norm is not finite (the step
itself was not applied). Each policy is registered by its config name and called as policy(trainer, state, loss,
grad_norm)."""

import torch

from ..errors import RunStopped
from ..model.registry import Registry
from .resume import load_weights

EXIT_NONFINITE = 3
NONFINITE = Registry("train.nonfinite policy")


def what(state, loss) -> str:
    return f"non-finite {'loss' if not torch.isfinite(loss) else 'gradient norm'} before step {state.step + 1}"


@NONFINITE.register("skip")
def skip(trainer, state, loss, grad_norm) -> None:
    """Drop the step and go on, halting after train.max_skipped of them in a row."""
    reason = what(state, loss)
    state.skipped += 1
    state.skipped_in_row += 1
    trainer.log.log({"step": state.step, "event": "skip", "reason": reason, "skipped": state.skipped})
    if state.skipped_in_row >= trainer.cfg.max_skipped:
        raise RunStopped(f"{reason}: {state.skipped_in_row} steps in a row skipped (train.max_skipped="
                         f"{trainer.cfg.max_skipped}); last checkpoint: {trainer.checkpointer.latest()}",
                         EXIT_NONFINITE)


@NONFINITE.register("halt")
def halt(trainer, state, loss, grad_norm) -> None:
    raise RunStopped(f"{what(state, loss)} (train.nonfinite=halt); last checkpoint: {trainer.checkpointer.latest()}",
                     EXIT_NONFINITE)


@NONFINITE.register("rollback")
def rollback(trainer, state, loss, grad_norm) -> None:
    """Back to the last checkpoint's weights and optimizer, with the learning rate scaled down; the clock, the
    data and the random streams keep moving forward."""
    reason, latest = what(state, loss), trainer.checkpointer.latest()
    load_weights(latest, trainer.model, trainer.optimizer, trainer.scaler, trainer.engine, trainer.averaging)
    state.rollbacks += 1
    state.lr_scale *= trainer.cfg.rollback_lr_factor
    trainer.log.log({"step": state.step, "event": "rollback", "reason": reason, "checkpoint": str(latest),
                     "lr_scale": state.lr_scale})
    if trainer.engine.main:
        print(f"{reason}: rolled back to {latest}, learning rate now x{state.lr_scale:g}", flush=True)


rollback.checkpoint_first = True  # it needs somewhere to go back to from the first step on
