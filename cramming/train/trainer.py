"""The budget loop: train until the wall-clock budget (or train.max_steps) is spent, losing nothing on the way.

Everything that changes over a run, the learning rate and the batch size, is a function of the elapsed budget
fraction read from the clock at each optimizer step (or of step / max_steps for the step-* schedules). The clock
starts when this loop starts (data and model are ready) and continues from the saved elapsed time on resume.

Between steps the loop may checkpoint (every train.checkpoint_every_minutes, and when a stop signal arrived).
Before each optimizer step it checks the loss and gradient norm: a non-finite value is skipped, halts the run,
or rolls back to the last checkpoint with a lower learning rate (train.nonfinite).
"""

import math
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..deepspeed_engine import step as deepspeed_step
from ..distributed import Distributed, full_norm, gradient_sync
from ..errors import RunStopped
from .curriculum import factor_at, regroup, sequence_length, stage_factors
from .resume import load_weights
from .schedule import SCHEDULES, batch_size_at, progress_by_steps
from .signals import EXIT_PREEMPTED, StopFlag

EXIT_NONFINITE = 3


@dataclass
class Budget:
    seconds: float
    max_steps: int | None = None

    def fraction(self, elapsed: float, step: int) -> float:
        by_time = elapsed / self.seconds
        by_steps = step / self.max_steps if self.max_steps else 0.0
        return min(1.0, max(by_time, by_steps))


def set_learning_rate(optimizer, factor: float) -> None:
    """Every group follows the schedule from its own peak (muon's matrices and its AdamW part differ)."""
    for group in optimizer.param_groups:
        group["lr"] = group["base_lr"] * factor


def train(model, optimizer, batches, objective, meta: dict, cfg_train, microbatch_size: int, budget: Budget,
          device, autocast, scaler, log, state, masks, checkpointer, distributed=None, validation=None) -> dict:
    """Train from `state` (fresh or resumed) until the budget is spent. Raises RunStopped on a stop signal
    (after checkpointing) or when train.nonfinite gives up.

    `batches` yields global microbatches (microbatch_size x world rows) of which this rank takes its slice;
    `masks` draws each microbatch's masks from its position in the stream; `validation`, a PeriodicValidation
    or None, measures the validation loss between steps with the budget clock paused."""
    distributed = distributed or Distributed()
    world, rank = distributed.world, distributed.rank
    deepspeed = distributed.engine == "deepspeed"  # the engine steps: DeepSpeed reduces, clips and checks
    schedule = SCHEDULES.get_or_explain(cfg_train.schedule)
    by_steps = progress_by_steps(cfg_train.schedule)
    stages = stage_factors(cfg_train.seq_schedule, meta["seq_length"])
    model.train()
    bar = tqdm(total=100, desc="training", bar_format="{l_bar}{bar}| {n:.1f}% [{elapsed}<{remaining}]{postfix}",
               mininterval=1, disable=not distributed.main)
    start = time.perf_counter() - state.elapsed
    with StopFlag() as stop, bar:  # the bar closes on every path, an exception's too
        # state.elapsed is the clock as all ranks agreed on it at the end of the previous step
        while (fraction := budget.fraction(state.elapsed, state.step)) < 1.0:
            step_start = time.perf_counter()
            progress = state.step / budget.max_steps if by_steps else fraction
            granule = microbatch_size * world  # one microbatch on every rank
            batch_size = batch_size_at(progress, cfg_train.batch_size, granule, cfg_train.batch_ramp)
            accumulation = batch_size // granule
            rows_per_sequence = factor_at(stages, progress)  # the curriculum's stage
            factor = schedule(progress, cfg_train.warmup, cfg_train.cooldown) * state.lr_scale
            set_learning_rate(optimizer, factor)
            lr = cfg_train.lr * factor  # logged: the train.lr groups' learning rate

            step_loss = torch.zeros((), device=device)
            done = step_tokens = 0
            while done < accumulation:
                sequences = microbatch_size // rows_per_sequence  # per rank, after joining rows
                batch = regroup(next(batches), rows_per_sequence)[rank * sequences:(rank + 1) * sequences]
                batch = batch.to(device, non_blocking=True)
                position = state.sequences + rank * microbatch_size  # this rank's first row in the stream
                state.sequences += granule  # rows of the stream: the data position
                step_tokens += batch.numel() * world
                inputs, labels = objective.batch(batch, masks.at(position))
                with gradient_sync(model, distributed, last_microbatch=done + 1 == accumulation):
                    with autocast():
                        loss = model(input_ids=inputs, labels=labels).loss / accumulation
                    if deepspeed:
                        model.backward(loss, scale_wrt_gas=False)  # already divided by our accumulation
                    else:
                        scaler.scale(loss).backward()
                step_loss += loss.detach()
                done += 1
                if not distributed.active and time.perf_counter() - start >= budget.seconds:
                    break  # out of time inside a large accumulated step: take it with what is there
            if done < accumulation:  # rescale so the update is the mean over the microbatches actually seen
                for param in model.parameters():
                    if param.grad is not None:
                        param.grad.mul_(accumulation / done)
                step_loss *= accumulation / done
                batch_size = done * microbatch_size

            step_loss = distributed.mean(step_loss)  # the gradients are already the mean over ranks
            if deepspeed:
                grad_norm, applied = deepspeed_step(model, step_loss)
            else:
                grad_norm, applied = optimizer_step(model, optimizer, scaler, step_loss, cfg_train.grad_clip)
            if not applied:
                handle_nonfinite(cfg_train, state, step_loss, grad_norm, model, optimizer, scaler, checkpointer, log)
                state.elapsed = distributed.agree(time.perf_counter() - start, device=device)[0]
                continue
            state.step += 1
            state.skipped_in_row = 0
            state.tokens += step_tokens

            if state.step == 1 and state.compile_seconds == 0.0:
                state.compile_seconds = time.perf_counter() - step_start
            if state.step % cfg_train.log_every == 0 and distributed.main:
                state.last_loss = step_loss.item()
                elapsed = time.perf_counter() - start
                log.log({
                    "step": state.step, "loss": state.last_loss, "lr": lr, "batch_size": batch_size,
                    "tokens": state.tokens, "tokens_per_s": step_tokens / (time.perf_counter() - step_start),
                    "seq_length": sequence_length(meta["seq_length"], rows_per_sequence),
                    "grad_norm": float(grad_norm), "elapsed_s": round(elapsed, 3),
                    "budget_fraction": round(budget.fraction(elapsed, state.step), 5),
                })
                bar.set_postfix_str(f"loss {state.last_loss:.3f} lr {lr:.2e} batch {batch_size}", refresh=False)
            # one agreement per step: the slowest clock, and a signal or a due checkpoint on any rank
            state.elapsed, stopped, due = distributed.agree(time.perf_counter() - start, stop.signal is not None,
                                                            checkpointer.due(), device=device)
            if stopped or due:
                saved = checkpointer.save(model, optimizer, scaler, state)
                state.elapsed = distributed.agree(time.perf_counter() - start, device=device)[0]
                if stopped:
                    raise RunStopped(f"stopped by {stop.signal or 'a signal to another rank'} at step {state.step}; "
                                     f"{saved_line(saved, checkpointer)}; run the same command again to resume "
                                     "(train.resume=auto)", EXIT_PREEMPTED)
            if validation is not None and validation.due(state.elapsed):
                paused = time.perf_counter()
                record = validation.measure()
                spent = time.perf_counter() - paused
                start += spent  # the budget clock stops while validating
                validation.seconds += spent
                log.log({"step": state.step, "event": "validation", "tokens": state.tokens,
                         "elapsed_s": round(state.elapsed, 3), **record})
            bar.n = round(100 * budget.fraction(state.elapsed, state.step), 1)
            bar.refresh()
        bar.n = 100
    if state.step and state.step % cfg_train.log_every:
        state.last_loss = step_loss.item()
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


def optimizer_step(model, optimizer, scaler, step_loss, grad_clip) -> tuple[torch.Tensor, bool]:
    """Clip, check, step. Returns the gradient norm and whether the update was applied (all finite).
    One host sync per step: the price of never applying a NaN. With fp16 the grad scaler owns non-finite
    gradients (it skips the step and lowers its scale), so only the loss is ours to check then."""
    scaler.unscale_(optimizer)
    grad_norm = full_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf))
    finite = torch.isfinite(step_loss)
    if not scaler.is_enabled():
        finite = finite & torch.isfinite(grad_norm)
    applied = bool(finite)  # the one sync
    if applied:
        scaler.step(optimizer)
    scaler.update()  # on every path: unscale_ above may run only once per update()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, applied


def handle_nonfinite(cfg_train, state, loss, grad_norm, model, optimizer, scaler, checkpointer, log) -> None:
    """train.nonfinite: skip the step (halting after max_skipped in a row), halt, or roll back."""
    what = f"non-finite {'loss' if not torch.isfinite(loss) else 'gradient norm'} before step {state.step + 1}"
    if cfg_train.nonfinite == "halt":
        raise RunStopped(f"{what} (train.nonfinite=halt); last checkpoint: {checkpointer.latest()}", EXIT_NONFINITE)
    if cfg_train.nonfinite == "rollback":
        latest = checkpointer.latest()
        load_weights(latest, model, optimizer, scaler, checkpointer.dist)
        state.rollbacks += 1
        state.lr_scale *= cfg_train.rollback_lr_factor
        log.log({"step": state.step, "event": "rollback", "reason": what, "checkpoint": str(latest),
                 "lr_scale": state.lr_scale})
        if checkpointer.dist.main:
            print(f"{what}: rolled back to {latest}, learning rate now x{state.lr_scale:g}", flush=True)
        return
    state.skipped += 1
    state.skipped_in_row += 1
    log.log({"step": state.step, "event": "skip", "reason": what, "skipped": state.skipped})
    if state.skipped_in_row >= cfg_train.max_skipped:
        raise RunStopped(f"{what}: {state.skipped_in_row} steps in a row skipped (train.max_skipped="
                         f"{cfg_train.max_skipped}); last checkpoint: {checkpointer.latest()}", EXIT_NONFINITE)
