"""Learning-rate schedules and the batch ramp, as functions of the run's progress in [0, 1].

Every schedule maps (progress, warmup, cooldown) to a multiplier of the peak learning rate in [0, 1]; warmup and
cooldown are shares of the run. The budget-* schedules (and `constant`) are fed the elapsed budget fraction:
driving them by wall-clock rather than by step count is what makes a run end on time whatever the hardware,
since a faster machine simply takes more steps along the same curve. Their step-* twins have the same shapes
but are fed step / train.max_steps, for runs that should see a fixed number of tokens. Each name is one
`Schedule`, which knows its shape and which of the two drives it (`by_steps`).

The trainer evaluates the schedule *before* each step, at the progress reached so far, so the first step sees
progress 0. A warm-up that started at exactly 0 would make that step a no-op; it starts at WARMUP_FLOOR instead.
"""

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch._dynamo

from ..config import TrainConfig
from ..model import modeling_crammed  # noqa: F401  (loads every variant: PATTERNS whole)
from ..model.patterns import PATTERNS
from ..registry import Registry, invalid
from .curriculum import sequence_length, stage_factors

SCHEDULES = Registry("schedule", ask=lambda entry, config: chosen_schedule_problem(entry, config))
SCHEDULES.serves(TrainConfig, "schedule")
WARMUP_FLOOR = 0.01  # the warm-up multiplier never goes below this, so the first step moves the weights


@dataclass(frozen=True)
class Schedule:
    """One `train.schedule` name: a shape of the learning rate and what drives it."""

    name: str
    shape: Callable[[float, float, float], float]  # (progress, warmup, cooldown) -> multiplier of the peak
    by_steps: bool  # progress is step / train.max_steps, not the elapsed budget fraction
    with_cooldown: bool  # the shape ends in a cool-down that must fit in the run beside the warm-up

    def __call__(self, progress: float, warmup: float, cooldown: float) -> float:
        return self.shape(progress, warmup, cooldown)

    def problem(self, warmup: float, cooldown: float, max_steps: int | None) -> str | None:
        """What is wrong with this schedule's settings, in one line for the user, or None."""
        if not 0 <= warmup < 1:
            return f"train.warmup={warmup!r} is invalid: must be in [0, 1) (a share of the run)"
        if not 0 <= cooldown < 1:
            return f"train.cooldown={cooldown!r} is invalid: must be in [0, 1) (a share of the run)"
        if self.with_cooldown and warmup + cooldown > 1:
            return (f"train.warmup + train.cooldown = {warmup + cooldown:g} is invalid for train.schedule="
                    f"{self.name}: the warm-up and the cool-down must fit in the run (sum <= 1)")
        if self.by_steps and not max_steps:
            return (f"train.schedule={self.name} needs train.max_steps (it runs on step / max_steps), "
                    "or use a budget-* schedule")
        return None


def register(budget_name: str, step_name: str, with_cooldown: bool = False):
    """Register a shape twice: driven by the budget fraction, and as its step-* twin driven by step / max_steps."""
    def add(shape):
        line = shape.__doc__.strip().split("\n")[0]  # the shape's first line, then what drives it
        SCHEDULES.register(budget_name, about=f"{line} Driven by the elapsed share of the budget.")(
            Schedule(budget_name, shape, False, with_cooldown))
        SCHEDULES.register(step_name, about=f"{line} Driven by step / train.max_steps.")(
            Schedule(step_name, shape, True, with_cooldown))
        return shape

    return add


def warm(progress: float, warmup: float) -> float:
    """Linear warm-up from 0 to 1 over the first `warmup` of the run (floored at WARMUP_FLOOR)."""
    return max(progress / warmup, WARMUP_FLOOR)


def decayed(progress: float, warmup: float) -> float:
    """How far the decay after the warm-up has got: 0 at its start, 1 at the end of the run."""
    return min(1.0, max(0.0, (progress - warmup) / (1.0 - warmup)))


@register("budget-triangle", "step-triangle")
def budget_triangle(progress: float, warmup: float, cooldown: float) -> float:
    """Cramming's "budget-triangle2": 25 % of peak at the start, peak at 75 %, 0 at the end (warmup, cooldown unused)."""
    if progress <= 0.75:
        return 0.25 + 0.75 * progress / 0.75
    return max(0.0, (1.0 - progress) / 0.25)


@register("budget-cosine", "step-cosine")
def budget_cosine(progress: float, warmup: float, cooldown: float) -> float:
    """Warm-up, then a cosine from peak to 0 at the end."""
    if progress < warmup:
        return warm(progress, warmup)
    return 0.5 * (1.0 + math.cos(math.pi * decayed(progress, warmup)))


@register("budget-linear", "step-linear")
def budget_linear(progress: float, warmup: float, cooldown: float) -> float:
    """Warm-up, then a straight line from peak to 0 at the end."""
    if progress < warmup:
        return warm(progress, warmup)
    return 1.0 - decayed(progress, warmup)


@register("budget-wsd", "step-wsd", with_cooldown=True)
def budget_wsd(progress: float, warmup: float, cooldown: float) -> float:
    """Warmup-stable-decay: warm-up, hold the peak, then decay linearly to 0 over the final `cooldown` share.

    The long plateau makes any point of it a good place to branch off a shorter run with its own cool-down."""
    if progress < warmup:
        return warm(progress, warmup)
    if cooldown > 0 and progress > 1.0 - cooldown:
        return max(0.0, (1.0 - progress) / cooldown)
    return 1.0


@register("constant", "step-constant")
def constant(progress: float, warmup: float, cooldown: float) -> float:
    """The peak throughout, after the warm-up (warmup=0 for none)."""
    if progress < warmup:
        return warm(progress, warmup)
    return 1.0


def chosen_schedule_problem(entry, config) -> str | None:
    """What the chosen schedule refuses in a run config (asked by config validation)."""
    t = config.train
    return entry.problem(t.warmup, t.cooldown, t.max_steps)


def schedule_problem(name: str, warmup: float, cooldown: float, max_steps: int | None) -> str | None:
    """What is wrong with this schedule setting, in one line for the user, or None."""
    if name not in SCHEDULES:
        return f"train.schedule={name!r} is not a valid option; choose one of: {', '.join(sorted(SCHEDULES))}"
    return SCHEDULES[name].problem(warmup, cooldown, max_steps)


def batch_size_at(fraction: float, batch_size: int, microbatch_size: int, ramp: float) -> int:
    """Sequences per optimizer step: a linear ramp from one microbatch to `batch_size` over the first
    `ramp` of the budget, always a whole number of microbatches (the ramp works by gradient accumulation)."""
    if ramp <= 0 or fraction >= ramp:
        return batch_size
    target = microbatch_size + (batch_size - microbatch_size) * fraction / ramp
    return max(microbatch_size, int(target // microbatch_size) * microbatch_size)


def window_at(stages, progress: float) -> int:
    """train.window_schedule's window at `progress`: [[fraction, window], ...] are consecutive stages whose
    fractions add up to 1, as train.seq_schedule's are. A pure function of progress, so a resumed run trains with
    exactly the window an uninterrupted one would."""
    end = 0.0
    for fraction, window in stages:
        end += fraction
        if progress < end:
            return int(window)
    return int(stages[-1][1])


def window_schedule_problem(config) -> str | None:
    """train.window_schedule against the attention patterns, the sequence and torch.compile (config: a
    PretrainConfig), or None."""
    stages, key = config.train.window_schedule, "train.window_schedule"
    if not stages:
        return None
    if not all(isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], (int, float)) and s[0] > 0
               and isinstance(s[1], int) and s[1] >= 1 for s in stages):
        return invalid(key, stages, "give [budget_fraction > 0, window >= 1] pairs")
    if abs(sum(s[0] for s in stages) - 1) > 1e-6:
        return invalid(key, stages, "the stages' budget fractions must add up to 1")
    attention = config.arch.attention
    windowed = [p for p in dict.fromkeys(attention.pattern) if PATTERNS.trait(p, "windowed")]
    if not windowed:
        return invalid(key, stages, f"needs a {PATTERNS.choices('windowed')} pattern in arch.attention.pattern (it has "
                       f"{attention.pattern}), whose window it changes")
    for _, window in stages:
        arch = replace(config.arch, attention=replace(attention, window=window))
        for pattern, (length, name) in itertools.product(windowed, trained_lengths(config)):
            if problem := PATTERNS[pattern].problem(replace(config, arch=arch), length, name):
                return invalid(key, stages, f"its window {window} is refused: {problem}")
    return compiled_windows_problem(config, {window for _, window in stages})


def trained_lengths(config) -> list[tuple[int, str]]:
    """(tokens, where the length comes from) of every sequence the run trains on: each window must suit each."""
    seq_length = config.data.seq_length
    stages = config.train.seq_schedule
    return [(seq_length, "data.seq_length")] + [(sequence_length(seq_length, k), "a train.seq_schedule stage")
                                                for _, k in stage_factors(stages, seq_length) if stages and k > 1]


def compiled_windows_problem(config, windows: set) -> str | None:
    """Each window is a new compiled graph; past torch._dynamo's recompile limit the model would quietly fall back
    to eager."""
    if config.impl.compile is False:
        return None
    limit = torch._dynamo.config.recompile_limit
    if len(windows) > limit:
        return invalid("train.window_schedule", config.train.window_schedule,
                       f"{len(windows)} windows under torch.compile are {len(windows)} graphs, past torch's "
                       f"recompile limit of {limit} (it would fall back to eager); use at most {limit} windows")
    return None
