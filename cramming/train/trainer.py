"""The budget loop: train until the wall-clock budget (or train.max_steps) is spent.

Everything that changes over a run, the learning rate and the batch size, is a function of the
elapsed budget fraction, read from the clock at each optimizer step. The clock starts when this loop
starts (data and model are ready); the first step, which carries torch.compile's work, is timed and
reported separately but counts against the budget like everything else.
"""

import math
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from .schedule import SCHEDULES, batch_size_at


@dataclass
class Budget:
    seconds: float
    max_steps: int | None = None

    def fraction(self, elapsed: float, step: int) -> float:
        by_time = elapsed / self.seconds
        by_steps = step / self.max_steps if self.max_steps else 0.0
        return min(1.0, max(by_time, by_steps))


def train(model, optimizer, batches, objective, meta: dict, cfg_train, microbatch_size: int, budget: Budget, device,
          autocast, scaler, log) -> dict:
    schedule = SCHEDULES.get_or_explain(cfg_train.schedule)
    seq_len = meta["seq_length"]
    generator = torch.Generator(device=device).manual_seed(torch.initial_seed() % 2**63)
    model.train()

    step, tokens, loss_value, first_step_seconds = 0, 0, float("nan"), 0.0
    bar = tqdm(total=100, desc="training", bar_format="{l_bar}{bar}| {n:.1f}% [{elapsed}<{remaining}]{postfix}",
               mininterval=1)
    start = time.perf_counter()
    while (fraction := budget.fraction(time.perf_counter() - start, step)) < 1.0:
        step_start = time.perf_counter()
        batch_size = batch_size_at(fraction, cfg_train.batch_size, microbatch_size, cfg_train.batch_ramp)
        accumulation = batch_size // microbatch_size
        lr = cfg_train.lr * schedule(fraction)
        for group in optimizer.param_groups:
            group["lr"] = lr

        step_loss = torch.zeros((), device=device)
        done = 0
        while done < accumulation:
            batch = next(batches).to(device, non_blocking=True)
            inputs, labels = objective.batch(batch, generator)
            with autocast():
                loss = model(input_ids=inputs, labels=labels).loss / accumulation
            scaler.scale(loss).backward()
            step_loss += loss.detach()
            done += 1
            if time.perf_counter() - start >= budget.seconds:
                break  # out of time inside a large accumulated step: take it with what is there
        if done < accumulation:  # rescale so the update is the mean over the microbatches actually seen
            for param in model.parameters():
                if param.grad is not None:
                    param.grad.mul_(accumulation / done)
            step_loss *= accumulation / done
            batch_size = done * microbatch_size

        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg_train.grad_clip or math.inf)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += batch_size * seq_len

        if step == 1:
            first_step_seconds = time.perf_counter() - step_start
        if step % cfg_train.log_every == 0:
            loss_value = step_loss.item()  # the only host sync of the step, and only on logging steps
            step_seconds = time.perf_counter() - step_start
            elapsed = time.perf_counter() - start
            log.log({
                "step": step, "loss": loss_value, "lr": lr, "batch_size": batch_size, "tokens": tokens,
                "tokens_per_s": batch_size * seq_len / step_seconds, "grad_norm": float(grad_norm),
                "elapsed_s": round(elapsed, 3), "budget_fraction": round(budget.fraction(elapsed, step), 5),
            })
            bar.set_postfix_str(f"loss {loss_value:.3f} lr {lr:.2e} batch {batch_size}", refresh=False)
        bar.n = round(100 * budget.fraction(time.perf_counter() - start, step), 1)
        bar.refresh()
    train_seconds = time.perf_counter() - start
    bar.n = 100
    bar.close()
    if step % cfg_train.log_every:
        loss_value = step_loss.item()
    return {
        "steps": step,
        "tokens": tokens,
        "final_train_loss": loss_value,
        "train_seconds": train_seconds,
        "compile_seconds": first_step_seconds,
        "tokens_per_s": tokens / train_seconds if train_seconds else 0.0,
    }
