"""train.nonfinite: what the loop does with an optimizer step whose loss or gradient norm is not finite (the step
itself was not applied). Each policy is registered by its config name and returns the action the trainer carries
out (Trainer.on_nonfinite): skip the step, halt the run, or roll back to the last checkpoint."""

from dataclasses import dataclass

from ..config import TrainConfig
from ..registry import Registry

EXIT_NONFINITE = 3
NONFINITE = Registry("train.nonfinite policy", traits={
    "checkpoint_first": "it needs a checkpoint before the first step (somewhere to go back to)",
    "continues": "it goes on from the weights it has, so the engine must not have applied a non-finite step",
})
NONFINITE.serves(TrainConfig, "nonfinite")


@dataclass(frozen=True)
class Skip:
    """Drop the step and go on; halt once `limit` steps in a row were dropped."""

    limit: int


@dataclass(frozen=True)
class Halt:
    """Stop the run, saying why (`why` follows the non-finite value's description)."""

    why: str


@dataclass(frozen=True)
class Rollback:
    """Back to the last checkpoint's weights and optimizer, with the learning rate times `lr_factor`; the clock,
    the data and the random streams keep moving forward."""

    lr_factor: float


@NONFINITE.register("skip", continues=True)
def skip(cfg) -> Skip:
    """Drop the step and go on, halting after train.skip.max_in_row of them in a row."""
    return Skip(cfg.skip.max_in_row)


@NONFINITE.register("halt")
def halt(cfg) -> Halt:
    """Stop the run at the first non-finite step, saying which value was not finite."""
    return Halt("(train.nonfinite=halt)")


@NONFINITE.register("rollback", checkpoint_first=True)  # from the first step on
def rollback(cfg) -> Rollback:
    """Back to the last checkpoint, the learning rate times train.rollback.lr_factor."""
    return Rollback(cfg.rollback.lr_factor)

