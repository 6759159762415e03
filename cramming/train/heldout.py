"""The held-out loss and accuracy (the run's validation split, train.validate_every_minutes), with the same masks every
time it is measured. Named for what it measures: config checks are `validate` in config.py."""

import torch

from ..data.loader import validation_batches
from .hooks import Hook
from .masking import PositionalMasks

VALIDATION_SEED = 1234


@torch.no_grad()  # not inference_mode: FSDP2 would keep its unsharded weights as inference tensors
def heldout_metrics(model, objective, folder, meta, cfg_train, batch_size: int, device, autocast) -> dict:
    """Each row's masks are drawn from its position in the validation split, so every run (any microbatch, any
    model) is scored on the same masked tokens."""
    was_training = model.training
    model.eval()
    masks = PositionalMasks(VALIDATION_SEED, device)
    total_loss, correct, count, row = 0.0, 0, 0, 0
    for batch in validation_batches(folder, meta, cfg_train.validation_sequences, batch_size):
        batch = batch.to(device)
        masked = [objective.batch(ids[None], masks.at(row + i)) for i, ids in enumerate(batch)]
        row += len(batch)
        inputs = {key: torch.cat([row[key] for row in masked]) if torch.is_tensor(value) else value
                  for key, value in masked[0].items()}  # tensors joined; a flag (pretraining=True) as it is
        with autocast():
            out = model(**inputs)
        predicted, targets = objective.scored(out, inputs)
        total_loss += out.loss.float().item() * targets.numel()
        correct += (predicted == targets).sum().item()
        count += targets.numel()
    model.train(was_training)
    return {"val_loss": total_loss / count, "val_accuracy": correct / count, "val_predicted_tokens": count}


class PeriodicHeldout(Hook):
    """train.validate_every_minutes: the validation loss during the run, for loss-by-time curves and time-to-loss.
    It is due each time the budget clock passes another multiple of the interval; the clock pauses while it
    runs, so validating costs wall time but no training. `measure` returns heldout_metrics' dict.

    With a `target` (train.target_loss) the first validation at or below it ends the loop (trainer.end), agreed by
    all ranks; `reached_at` is the budget clock of that validation, the race's time to target."""

    def __init__(self, every_minutes: float, measure, target: float | None = None):
        self.every = every_minutes * 60
        self.measure = measure
        self.target = target
        self.reached_at = None  # budget seconds at the validation that reached the target
        self.passed = None  # intervals the clock had passed at the last check
        self.seconds = 0.0  # wall time spent validating (the summary's wall_seconds.eval)

    def due(self, elapsed: float) -> bool:
        """From the agreed clock, so every rank decides the same; a resumed run goes on from its clock."""
        passed = int(elapsed // self.every)
        if self.passed is None:
            self.passed = passed
        due, self.passed = passed > self.passed, max(passed, self.passed)
        return due

    def on_between(self, trainer, state) -> None:
        if not self.due(state.elapsed):
            return
        with trainer.paused() as pause:
            record = self.measure()
        self.seconds += pause.seconds
        trainer.parts.log.log({"step": state.step, "event": "validation", "tokens": state.tokens,
                               "elapsed_s": round(state.elapsed, 6), **record})
        if self.target is None:
            return
        reached = record["val_loss"] <= self.target
        if trainer.parts.engine.agree(float(reached), device=trainer.device)[0]:  # any rank's reaching stops all
            self.reached_at = state.elapsed
            trainer.end(f"validation loss {record['val_loss']:.4f} <= train.target_loss={self.target:g} at "
                        f"{state.elapsed:.1f} budget seconds, step {state.step}")


def target_summary(validation: PeriodicHeldout | None) -> dict:
    """train_summary.json's race keys (train.target_loss). seconds_to_target is on the budget clock: training
    seconds, the first step's compile and checkpoint writes included, validations excluded; null if not reached."""
    target = validation.target if validation else None
    reached_at = validation.reached_at if validation else None
    return {"target_loss": target, "reached_target": reached_at is not None, "seconds_to_target": reached_at}
