"""Learning-rate schedules and the batch ramp, as functions of the elapsed budget fraction in [0, 1].

Driving them by wall-clock fraction rather than by step count is what makes a run end on time whatever
the hardware: a faster machine simply takes more steps along the same curve.
"""

import math

from ..model.registry import Registry

SCHEDULES = Registry("schedule")


@SCHEDULES.register("budget-triangle")
def budget_triangle(fraction: float) -> float:
    """Cramming's "budget-triangle2": 25 % of peak at the start, peak at 75 % of the budget, 0 at the end."""
    if fraction <= 0.75:
        return 0.25 + 0.75 * fraction / 0.75
    return max(0.0, (1.0 - fraction) / 0.25)


@SCHEDULES.register("budget-cosine")
def budget_cosine(fraction: float) -> float:
    """Cosine from peak to 0 over the budget, after a warm-up over its first 10 %."""
    if fraction < 0.1:
        return fraction / 0.1
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (fraction - 0.1) / 0.9)))


@SCHEDULES.register("constant")
def constant(fraction: float) -> float:
    return 1.0


def batch_size_at(fraction: float, batch_size: int, microbatch_size: int, ramp: float) -> int:
    """Sequences per optimizer step: a linear ramp from one microbatch to `batch_size` over the first
    `ramp` of the budget, always a whole number of microbatches (the ramp works by gradient accumulation)."""
    if ramp <= 0 or fraction >= ramp:
        return batch_size
    target = microbatch_size + (batch_size - microbatch_size) * fraction / ramp
    return max(microbatch_size, int(target // microbatch_size) * microbatch_size)
