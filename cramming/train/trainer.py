"""The budget loop: train until the wall-clock budget (or train.max_steps) is spent, losing nothing on the way.

Everything that changes over a run, the learning rate and the batch size, is a function of the elapsed budget
fraction read from the clock at each optimizer step (or of step / max_steps for the step-* schedules). The clock
starts when the loop starts (data and model are ready) and continues from the saved elapsed time on resume.

Between steps the loop may checkpoint (every train.checkpoint_every_minutes, and when a stop signal arrived) and
validate (train.validate_every_minutes, with the clock paused). Before each optimizer step it checks the loss and
gradient norm: a non-finite value is handled by the train.nonfinite policy (nonfinite.py).
"""

import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..engines import Engine
from ..errors import RunStopped
from ..model.window import set_attention_window
from .curriculum import factor_at, regroup, sequence_length, stage_factors
from .nonfinite import NONFINITE
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
class Trainer:
    """Owns the parts of a run. `model` is the module the loop calls (compiled or wrapped by the engine);
    `batches` yields global microbatches (microbatch x world rows) of which this rank takes its slice; `masks`
    draws each microbatch's masks from its position in the stream; `validation` (a PeriodicValidation) or None."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    engine: Engine
    objective: object
    masks: object
    batches: object
    checkpointer: object
    log: object
    cfg: object  # TrainConfig
    meta: dict
    microbatch: int
    budget: Budget
    device: torch.device
    autocast: object
    validation: object = None
    averaging: object = None  # an Averager (averaging.py), updated after each applied step, or None
    energy: object = None  # an EnergyMeter (energy.py): joules while the budget clock runs, or None

    def __post_init__(self):
        self.schedule = SCHEDULES.get_or_explain(self.cfg.schedule)
        self.by_steps = self.schedule.by_steps  # the step-* schedules follow step / max_steps, not the clock
        self.stages = stage_factors(self.cfg.seq_schedule, self.meta["seq_length"])
        self.on_nonfinite = NONFINITE.get_or_explain(self.cfg.nonfinite)
        self.start = 0.0  # perf_counter() at budget second 0; moved on by validations (the clock pauses)

    def clock(self) -> float:
        return time.perf_counter() - self.start

    def fit(self, state) -> dict:
        """Train from `state` (fresh or resumed) until the budget is spent. Raises RunStopped on a stop signal
        (after checkpointing) or when train.nonfinite gives up."""
        self.model.train()
        bar = tqdm(total=100, desc="training", bar_format="{l_bar}{bar}| {n:.1f}% [{elapsed}<{remaining}]{postfix}",
                   mininterval=1, disable=not self.engine.main)
        self.start = time.perf_counter() - state.elapsed
        if self.energy is not None:
            self.energy.begin(state.energy_joules)
        step_loss = None
        with StopFlag() as stop, bar:  # the bar closes on every path, an exception's too
            # state.elapsed is the clock as all ranks agreed on it at the end of the previous step
            while (fraction := self.budget.fraction(state.elapsed, state.step)) < 1.0:
                step_start = time.perf_counter()
                plan = self.plan(state, fraction)
                step_loss, step_tokens, batch_size = self.accumulate(state, plan)
                step_loss = self.engine.mean(step_loss)  # the gradients are already the mean over ranks
                grad_norm, applied = self.engine.step(self.model, self.optimizer, self.scaler, step_loss,
                                                      self.cfg.grad_clip)
                if not applied:
                    self.on_nonfinite(self, state, step_loss, grad_norm)
                    state.elapsed = self.engine.agree(self.clock(), device=self.device)[0]
                    continue
                state.step += 1
                state.skipped_in_row = 0
                state.tokens += step_tokens
                if state.step == 1 and state.compile_seconds == 0.0:
                    state.compile_seconds = time.perf_counter() - step_start
                if self.averaging is not None:  # the fraction from the clock all ranks agreed on last
                    self.averaging.update(state.step, self.budget.fraction(state.elapsed, state.step))
                if state.step % self.cfg.log_every == 0 and self.engine.main:
                    state.last_loss = step_loss.item()
                    self.log_step(state, plan, batch_size, step_tokens, grad_norm, step_start)
                    bar.set_postfix_str(f"loss {state.last_loss:.3f} lr {plan.lr:.2e} batch {batch_size}",
                                        refresh=False)
                self.between_steps(state, stop)
                bar.n = round(100 * self.budget.fraction(state.elapsed, state.step), 1)
                bar.refresh()
            bar.n = 100
        if self.energy is not None:
            self.energy.stop()
        if state.step and state.step % self.cfg.log_every and step_loss is not None:
            state.last_loss = step_loss.item()
        return self.result(state)

    def plan(self, state, fraction: float) -> StepPlan:
        cfg = self.cfg
        progress = state.step / self.budget.max_steps if self.by_steps else fraction
        granule = self.microbatch * self.engine.world  # one microbatch on every rank
        batch_size = batch_size_at(progress, cfg.batch_size, granule, cfg.batch_ramp)
        factor = self.schedule(progress, cfg.warmup, cfg.cooldown) * state.lr_scale
        set_learning_rate(self.optimizer, factor)
        if cfg.window_schedule:  # the attention-window warm-up, like the learning rate a function of progress
            set_attention_window(self.engine.unwrap(self.model), window_at(cfg.window_schedule, progress))
        return StepPlan(batch_size, batch_size // granule, factor_at(self.stages, progress), cfg.lr * factor)

    def accumulate(self, state, plan: StepPlan) -> tuple[torch.Tensor, int, int]:
        """Forward and backward over the step's microbatches; returns the step loss, its tokens (all ranks) and
        the batch size it really had (one process may stop inside a long step when the budget runs out)."""
        engine, world, rank = self.engine, self.engine.world, self.engine.rank
        step_loss = torch.zeros((), device=self.device)
        done = step_tokens = 0
        sequences = self.microbatch // plan.rows_per_sequence  # per rank, after joining rows
        while done < plan.accumulation:
            batch = regroup(next(self.batches), plan.rows_per_sequence)[rank * sequences:(rank + 1) * sequences]
            batch = batch.to(self.device, non_blocking=True)
            position = state.sequences + rank * self.microbatch  # this rank's first row in the stream
            state.sequences += self.microbatch * world  # rows of the stream: the data position
            step_tokens += batch.numel() * world
            inputs = self.objective.batch(batch, self.masks.at(position))  # the model's keyword arguments
            with engine.no_sync(self.model, last_microbatch=done + 1 == plan.accumulation):
                with self.autocast():
                    loss = self.model(**inputs).loss / plan.accumulation
                engine.backward(self.model, loss, self.scaler)
            step_loss += loss.detach()
            done += 1
            if engine.stops_within_step and self.clock() >= self.budget.seconds:
                break  # out of time inside a large accumulated step: take it with what is there
        if done < plan.accumulation:  # rescale so the update is the mean over the microbatches actually seen
            for param in self.model.parameters():
                if param.grad is not None:
                    param.grad.mul_(plan.accumulation / done)
            step_loss *= plan.accumulation / done
            return step_loss, step_tokens, done * self.microbatch
        return step_loss, step_tokens, plan.batch_size

    def log_step(self, state, plan: StepPlan, batch_size: int, step_tokens: int, grad_norm, step_start) -> None:
        elapsed = self.clock()
        self.log.log({
            "step": state.step, "loss": state.last_loss, "lr": plan.lr, "batch_size": batch_size,
            "tokens": state.tokens, "tokens_per_s": step_tokens / (time.perf_counter() - step_start),
            "seq_length": sequence_length(self.meta["seq_length"], plan.rows_per_sequence),
            "grad_norm": float(grad_norm), "elapsed_s": round(elapsed, 3),
            "budget_fraction": round(self.budget.fraction(elapsed, state.step), 5),
        })

    def between_steps(self, state, stop) -> None:
        """One agreement per step (the slowest clock, and a signal or a due checkpoint on any rank), then the
        checkpoint and the validation that are due."""
        state.elapsed, stopped, due = self.engine.agree(self.clock(), stop.signal is not None,
                                                        self.checkpointer.due(), device=self.device)
        if self.energy is not None:
            self.energy.sample()
        if stopped or due:
            if self.energy is not None:  # the run's joules so far, for a resumed launch to go on from
                self.energy.sample(force=True)
                state.energy_joules = self.energy.run_joules(self.engine, self.device)
            saved = self.checkpointer.save(self.model, self.optimizer, self.scaler, state)
            state.elapsed = self.engine.agree(self.clock(), device=self.device)[0]
            if stopped:
                raise RunStopped(f"stopped by {stop.signal or 'a signal to another rank'} at step {state.step}; "
                                 f"{saved_line(saved, self.checkpointer)}; run the same command again to resume "
                                 "(train.resume=auto)", EXIT_PREEMPTED)
        if self.validation is not None and self.validation.due(state.elapsed):
            paused = time.perf_counter()
            if self.energy is not None:
                self.energy.pause()
            record = self.validation.measure()
            if self.energy is not None:
                self.energy.resume()
            spent = time.perf_counter() - paused
            self.start += spent  # the budget clock stops while validating
            self.validation.seconds += spent
            self.log.log({"step": state.step, "event": "validation", "tokens": state.tokens,
                          "elapsed_s": round(state.elapsed, 6), **record})

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
