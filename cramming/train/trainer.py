"""The budget loop: train until the wall-clock budget (or train.max_steps) is spent, losing nothing on the way.

Everything that changes over a run, the learning rate and the batch size, is a function of the elapsed budget
fraction read from the clock at each optimizer step (or of step / max_steps for the step-* schedules). The clock
starts when the loop starts (data and model are ready) and continues from the saved elapsed time on resume.

Between steps the loop may checkpoint (every train.checkpoint_every_minutes, and when a stop signal arrived) and
calls its hooks (hooks.py: the energy meter, weight averaging, a validation every train.validate_every_minutes
with the clock paused). Before each optimizer step it checks the loss and gradient norm: a non-finite value gets
the action the train.nonfinite policy returns (nonfinite.py), which the trainer carries out. A hook may end the
run early and cleanly (trainer.end: the periodic validation reaching train.target_loss).
"""

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from ..config import TrainConfig
from ..engines import ENGINES, Engine
from ..errors import RunStopped
from ..model.modeling_crammed import set_attention_window
from .checkpointing import Checkpointer, load_weights
from .curriculum import factor_at, regroup, sequence_length, stage_factors
from .hooks import Hook
from .masking import PositionalMasks
from .metrics import MetricsLog, SilentLog
from .nonfinite import EXIT_NONFINITE, NONFINITE, Halt, Skip
from .objectives import Objective
from .schedule import SCHEDULES, batch_size_at, window_at
from .signals import EXIT_PREEMPTED, StopFlag


@dataclass
class Budget:
    seconds: float
    max_steps: int | None = None

    def fraction(self, elapsed: float, step: int) -> float:
        by_time = elapsed / self.seconds
        by_steps = step / self.max_steps if self.max_steps else 0.0
        return min(1.0, max(by_time, by_steps))


@dataclass
class StepPlan:
    """What one optimizer step does, read from the budget fraction when it starts."""

    batch_size: int
    accumulation: int
    rows_per_sequence: int  # the curriculum's stage: rows joined into one longer sequence
    lr: float  # the train.lr groups' learning rate, for the log


def set_learning_rate(optimizer, factor: float) -> None:
    """Every group follows the schedule from its own peak (muon's matrices and its AdamW part differ)."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor


@dataclass
class Parts:
    """What the loop works with, built by pretraining.py. `model` is the module the loop calls (compiled or
    wrapped by the engine); `batches` yields global microbatches (microbatch x world rows) of which this rank takes
    its slice; `masks` draws each microbatch's masks from its position in the stream."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    engine: Engine
    objective: Objective
    masks: PositionalMasks
    batches: Iterator[torch.Tensor]
    checkpointer: Checkpointer
    log: MetricsLog | SilentLog


class Paused:
    """trainer.paused()'s handle: the wall seconds the pause took, once it is over."""

    seconds = 0.0


@dataclass
class Trainer:
    """Owns the parts of a run and the loop's settings; `hooks` (hooks.py) are called in turn at fixed moments:
    the energy meter, the weight averaging and the periodic validation."""

    parts: Parts
    cfg: TrainConfig
    budget: Budget
    microbatch: int
    seq_length: int  # the data's rows; the curriculum joins them into longer sequences
    device: torch.device
    autocast: Callable
    hooks: list[Hook] = field(default_factory=list)

    def __post_init__(self):
        self.schedule = SCHEDULES.get_or_explain(self.cfg.schedule)
        self.by_steps = self.schedule.by_steps  # the step-* schedules follow step / max_steps, not the clock
        self.stages = stage_factors(self.cfg.seq_schedule, self.seq_length)
        self.nonfinite = NONFINITE.get_or_explain(self.cfg.nonfinite)
        self.start = 0.0  # perf_counter() at budget second 0; moved on by pauses (the clock stops)
        self.ended = None  # why a hook ended the run before its budget (train.target_loss), or None

    def end(self, why: str) -> None:
        """A hook's clean early end (the target loss reached): the loop stops before its next step. Every rank
        must call it at the same step (decide from agreed values)."""
        self.ended = why

    def clock(self) -> float:
        return time.perf_counter() - self.start

    def call(self, moment: str, state) -> None:
        for hook in self.hooks:
            getattr(hook, moment)(self, state)

    @contextlib.contextmanager
    def paused(self):
        """Time that is not budget time (a validation): the clock and every hook stop, and go on after."""
        handle, started = Paused(), time.perf_counter()
        for hook in self.hooks:
            hook.on_pause()
        try:
            yield handle
        finally:
            for hook in self.hooks:
                hook.on_resume()
            handle.seconds = time.perf_counter() - started
            self.start += handle.seconds

    def fit(self, state, stop: StopFlag | None = None) -> dict:
        """Train from `state` (fresh or resumed) until the budget is spent. Raises RunStopped on a stop signal
        (after checkpointing) or when train.nonfinite gives up. `stop`: a flag the caller holds on past the loop
        (pretraining's final validation and save), else the loop's own."""
        p = self.parts
        p.model.train()
        bar = tqdm(total=100, desc="training", bar_format="{l_bar}{bar}| {n:.1f}% [{elapsed}<{remaining}]{postfix}",
                   mininterval=1, disable=not p.engine.main)
        self.start = time.perf_counter() - state.elapsed
        self.call("on_begin", state)
        step_loss = None
        with contextlib.nullcontext(stop) if stop else StopFlag() as stop, bar:  # the bar closes on every path
            # state.elapsed is the clock as all ranks agreed on it at the end of the previous step
            while self.ended is None and (fraction := self.budget.fraction(state.elapsed, state.step)) < 1.0:
                step_start = time.perf_counter()
                plan = self.plan(state, fraction)
                step_loss, step_tokens, batch_size = self.accumulate(state, plan)
                step_loss = p.engine.mean(step_loss)  # the gradients are already the mean over ranks
                grad_norm, applied = p.engine.step(p.model, p.optimizer, p.scaler, step_loss, self.cfg.grad_clip)
                if not applied:
                    self.on_nonfinite(state, step_loss)
                    state.elapsed = p.engine.agree(self.clock(), device=self.device)[0]
                    continue
                state.step += 1
                state.skipped_in_row = 0
                state.tokens += step_tokens
                if state.step == 1 and state.compile_seconds == 0.0:
                    state.compile_seconds = time.perf_counter() - step_start
                self.call("on_step", state)
                if state.step % self.cfg.log_every == 0 and p.engine.main:
                    state.last_loss = step_loss.item()
                    self.log_step(state, plan, batch_size, step_tokens, grad_norm, step_start)
                    bar.set_postfix_str(f"loss {state.last_loss:.3f} lr {plan.lr:.2e} batch {batch_size}",
                                        refresh=False)
                self.between_steps(state, stop)
                bar.n = round(100 * self.budget.fraction(state.elapsed, state.step), 1)
                bar.refresh()
            bar.n = 100
        stop.then = "the budget is spent: finishing the run's final validation and checkpoint first"
        self.call("on_end", state)
        if state.step and state.step % self.cfg.log_every and step_loss is not None:
            state.last_loss = step_loss.item()
        return self.result(state)

    def plan(self, state, fraction: float) -> StepPlan:
        cfg = self.cfg
        progress = state.step / self.budget.max_steps if self.by_steps else fraction
        granule = self.microbatch * self.parts.engine.world  # one microbatch on every rank
        batch_size = batch_size_at(progress, cfg.batch_size, granule, cfg.batch_ramp)
        factor = self.schedule(progress, cfg.warmup, cfg.cooldown) * state.lr_scale
        set_learning_rate(self.parts.optimizer, factor)
        if cfg.window_schedule:  # the attention-window warm-up, like the learning rate a function of progress
            set_attention_window(self.parts.engine.unwrap(self.parts.model), window_at(cfg.window_schedule, progress))
        return StepPlan(batch_size, batch_size // granule, factor_at(self.stages, progress), cfg.lr * factor)

    def accumulate(self, state, plan: StepPlan) -> tuple[torch.Tensor, int, int]:
        """Forward and backward over the step's microbatches; returns the step loss, its tokens (all ranks) and
        the batch size it really had (one process may stop inside a long step when the budget runs out)."""
        p = self.parts
        engine, world, rank = p.engine, p.engine.world, p.engine.rank
        step_loss = torch.zeros((), device=self.device)
        done = step_tokens = 0
        sequences = self.microbatch // plan.rows_per_sequence  # per rank, after joining rows
        while done < plan.accumulation:
            batch = regroup(next(p.batches), plan.rows_per_sequence)[rank * sequences:(rank + 1) * sequences]
            batch = batch.to(self.device, non_blocking=True)
            position = state.sequences + rank * self.microbatch  # this rank's first row in the stream
            state.sequences += self.microbatch * world  # rows of the stream: the data position
            step_tokens += batch.numel() * world
            inputs = p.objective.batch(batch, p.masks.at(position))  # the model's keyword arguments
            with engine.no_sync(p.model, last_microbatch=done + 1 == plan.accumulation):
                with self.autocast():
                    loss = p.model(**inputs).loss / plan.accumulation
                engine.backward(p.model, loss, p.scaler)
            step_loss += loss.detach()
            done += 1
            if not ENGINES.trait(engine, "whole_steps") and self.clock() >= self.budget.seconds:
                break  # out of time inside a large accumulated step: take it with what is there (one process)
        if done < plan.accumulation:  # rescale so the update is the mean over the microbatches actually seen
            for param in p.model.parameters():
                if param.grad is not None:
                    param.grad.mul_(plan.accumulation / done)
            step_loss *= plan.accumulation / done
            return step_loss, step_tokens, done * self.microbatch
        return step_loss, step_tokens, plan.batch_size

    def log_step(self, state, plan: StepPlan, batch_size: int, step_tokens: int, grad_norm, step_start) -> None:
        elapsed = self.clock()
        self.parts.log.log({
            "step": state.step, "loss": state.last_loss, "lr": plan.lr, "batch_size": batch_size,
            "tokens": state.tokens, "tokens_per_s": step_tokens / (time.perf_counter() - step_start),
            "seq_length": sequence_length(self.seq_length, plan.rows_per_sequence),
            "grad_norm": float(grad_norm), "elapsed_s": round(elapsed, 3),
            "budget_fraction": round(self.budget.fraction(elapsed, state.step), 5),
        })

    def between_steps(self, state, stop) -> None:
        """One agreement per step (the slowest clock, and a signal or a due checkpoint on any rank), then the
        checkpoint that is due, then the hooks (a due validation among them)."""
        p = self.parts
        state.elapsed, stopped, due = p.engine.agree(self.clock(), stop.signal is not None, p.checkpointer.due(),
                                                     device=self.device)
        if stopped or due:
            self.call("on_checkpoint", state)
            saved = p.checkpointer.save(p.model, p.optimizer, p.scaler, state)
            state.elapsed = p.engine.agree(self.clock(), device=self.device)[0]
            if stopped:
                raise RunStopped(f"stopped by {stop.signal or 'a signal to another rank'} at step {state.step}; "
                                 f"{saved_line(saved, p.checkpointer)}; run the same command again to resume "
                                 "(train.resume=auto)", EXIT_PREEMPTED)
        self.call("on_between", state)

    def on_nonfinite(self, state, loss) -> None:
        """Carry out what train.nonfinite's policy says about a step that was not applied (nonfinite.py)."""
        p, action = self.parts, self.nonfinite(self.cfg)
        reason = f"non-finite {'loss' if not torch.isfinite(loss) else 'gradient norm'} before step {state.step + 1}"
        if isinstance(action, Halt):
            raise RunStopped(f"{reason} {action.why}; last checkpoint: {p.checkpointer.latest()}", EXIT_NONFINITE)
        if isinstance(action, Skip):
            state.skipped += 1
            state.skipped_in_row += 1
            p.log.log({"step": state.step, "event": "skip", "reason": reason, "skipped": state.skipped})
            if state.skipped_in_row >= action.limit:
                raise RunStopped(f"{reason}: {state.skipped_in_row} steps in a row skipped (train.skip.max_in_row="
                                 f"{action.limit}); last checkpoint: {p.checkpointer.latest()}", EXIT_NONFINITE)
            return
        latest = p.checkpointer.latest()  # Rollback
        saved = load_weights(latest, p.model, p.optimizer, p.scaler, p.engine)
        for hook in self.hooks:
            hook.on_rollback(saved, latest)
        state.rollbacks += 1
        state.lr_scale *= action.lr_factor
        p.log.log({"step": state.step, "event": "rollback", "reason": reason, "checkpoint": str(latest),
                   "lr_scale": state.lr_scale})
        if p.engine.main:
            print(f"{reason}: rolled back to {latest}, learning rate now x{state.lr_scale:g}", flush=True)

    def result(self, state) -> dict:
        # the loop's time without checkpoint writes and without the first step (compile_seconds, torch.compile's
        # work): tokens_per_s, and so MFU, is tokens over the seconds the summary reports as wall_seconds.train
        train_seconds = state.elapsed - state.checkpoint_seconds - state.compile_seconds
        return {
            "steps": state.step,
            "tokens": state.tokens,
            "final_train_loss": state.last_loss,
            "train_seconds": train_seconds,
            "compile_seconds": state.compile_seconds,
            "checkpoint_seconds": state.checkpoint_seconds,
            "tokens_per_s": state.tokens / train_seconds if train_seconds > 0 and state.step > 1 else 0.0,
            "skipped_steps": state.skipped,
            "rollbacks": state.rollbacks,
        }


def saved_line(saved, checkpointer) -> str:
    """What a stop wrote: a refused save (a weight not finite) leaves the previous checkpoint as the latest."""
    if saved is not None:
        return f"checkpoint {saved}"
    latest = checkpointer.latest()
    return ("no checkpoint written, a weight is not finite; "
            + (f"the last whole one is {latest}" if latest else "there is no earlier one to resume from"))
