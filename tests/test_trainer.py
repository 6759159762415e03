"""The budget loop: it ends on time even inside a large accumulated step, it learns, and it keeps going (or stops
saying why) when a step is not finite."""

import contextlib
import math
import os
import signal
import time

import pytest
import torch
from test_resume import TINY, config_for
from tqdm import tqdm

from cramming.config import ArchConfig, DataConfig, RollbackConfig, SkipConfig, TrainConfig
from cramming.data.loader import train_batches
from cramming.data.prepare import prepare_data
from cramming.engines import Engine
from cramming.engines.ddp import DDP
from cramming.errors import RunStopped, UserError
from cramming.impl import Runtime
from cramming.pretraining import pretrain
from cramming.run import build_model
from cramming.train.checkpointing import Checkpointer
from cramming.train.hooks import Hook
from cramming.train.masking import PositionalMasks
from cramming.train.objectives import build_objective
from cramming.train.optim import build_optimizer
from cramming.train.state import TrainState
from cramming.train.trainer import Budget, Parts, Trainer


class ListLog:
    def __init__(self):
        self.records = []

    def log(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def sanity_data(tmp_path_factory):
    cfg = DataConfig(source="sanity", vocab_size=256, seq_length=32, max_chars=200_000, validation_fraction=0.05,
                     cache_dir=str(tmp_path_factory.mktemp("cache")))
    return prepare_data(cfg)


def run(data, budget, train_cfg, microbatch=8, seed=0, tmp_dir="/nonexistent-never-written", precision="fp32",
        log=None, save_first=False, validation=None, hooks=(), objective="mlm"):
    """Train a tiny model in-process; `save_first` writes a checkpoint before the first step (as pretraining does
    for train.nonfinite=rollback)."""
    folder, meta = data
    torch.manual_seed(seed)
    arch = ArchConfig(num_layers=2, hidden_size=64, num_heads=4, ffn_size=128, max_seq_length=32, objective=objective)
    cpu = torch.device("cpu")
    runtime = Runtime(cpu, precision, False, "sdpa", "torch")
    model = build_model(arch, meta["vocab_size"], meta["special_ids"], runtime)
    optimizer = build_optimizer(model, train_cfg, torch.device("cpu"))
    batches = train_batches(folder, meta, "random", seed, microbatch, 0, False)
    log = log or ListLog()
    log.model = model
    scaler = runtime.grad_scaler()
    objective = build_objective(objective, train_cfg, meta, cpu)
    masks = PositionalMasks(seed, cpu)
    checkpointer = Checkpointer(tmp_dir, None, 1, {})
    state = TrainState()
    if save_first:
        checkpointer.save(model, optimizer, scaler, state)
    parts = Parts(model=model, optimizer=optimizer, scaler=scaler, engine=Engine(), objective=objective, masks=masks,
                  batches=batches, checkpointer=checkpointer, log=log)
    trainer = Trainer(parts=parts, cfg=train_cfg, budget=budget, microbatch=microbatch, seq_length=meta["seq_length"],
                      device=cpu, autocast=runtime.autocast(), hooks=[*([validation] if validation else []), *hooks])
    result = trainer.fit(state)
    return result, log.records


def test_stops_on_time_inside_a_huge_accumulated_step(sanity_data):
    cfg = TrainConfig(batch_size=8 * 100_000, batch_ramp=0.0)  # one step would take many minutes
    result, records = run(sanity_data, Budget(seconds=2.0), cfg)
    assert result["steps"] == 1
    assert result["train_seconds"] < 2.0 + 1.0  # at most one microbatch past the deadline
    assert records[0]["batch_size"] < 8 * 100_000  # the partial step is reported as what it was


def test_max_steps_and_logging(sanity_data):
    cfg = TrainConfig(batch_size=16, batch_ramp=0.5, max_steps=6, lr=1e-3)
    result, records = run(sanity_data, Budget(seconds=3600, max_steps=6), cfg)
    assert result["steps"] == 6 and [r["step"] for r in records] == list(range(1, 7))
    assert records[0]["batch_size"] == 8 and records[-1]["batch_size"] == 16  # the ramp
    assert records[0]["lr"] == pytest.approx(0.25e-3)  # triangle starts at 25 % of peak
    assert result["tokens"] == sum(r["batch_size"] for r in records) * 32
    for key in ("loss", "lr", "batch_size", "tokens", "tokens_per_s", "elapsed_s", "grad_norm"):
        assert key in records[0]


def test_the_logged_seq_length_is_the_curriculum_stages():
    """metrics.jsonl's seq_length is the length of the sequences a step trained on: in a train.seq_schedule stage
    that joins k rows of data.seq_length S, k (S - 1) + 1 tokens (one [CLS]), not S."""
    weight = torch.nn.Parameter(torch.zeros(1))
    log = ListLog()
    parts = Parts(model=None, optimizer=torch.optim.SGD([{"params": [weight], "base_lr": 1e-3}], lr=1e-3),
                  scaler=None, engine=Engine(), objective=None, masks=None, batches=None, checkpointer=None, log=log)
    cfg = TrainConfig(batch_size=16, batch_ramp=0.0, seq_schedule=[[0.5, 32], [0.5, 128]])
    trainer = Trainer(parts=parts, cfg=cfg, budget=Budget(seconds=60.0), microbatch=8, seq_length=32,
                      device=torch.device("cpu"), autocast=contextlib.nullcontext)
    for fraction, length in ((0.25, 32), (0.75, 4 * 31 + 1)):
        state = TrainState(step=1, tokens=16 * length)
        plan = trainer.plan(state, fraction)
        trainer.log_step(state, plan, 16, 16 * length, torch.tensor(1.0), time.perf_counter() - 1.0)
        assert log.records[-1]["seq_length"] == length


def test_periodic_validation_pauses_the_budget_clock(sanity_data):
    """train.validate_every_minutes: a validation each time the clock passes another interval, logged as an event
    with the clock it was taken at; the time it takes is not budget time. Each bound allows for a loaded machine:
    steps may be slow (fewer intervals), never a validation counted as budget."""
    from cramming.train.heldout import PeriodicHeldout

    def measure():
        time.sleep(1.0)  # far longer than a step: a clock that kept running would end the 2 s budget early
        return {"val_loss": 1.0}

    validation = PeriodicHeldout(0.3 / 60, measure)  # every 0.3 s of budget
    cfg = TrainConfig(batch_size=8, batch_ramp=0.0)
    started = time.perf_counter()
    result, records = run(sanity_data, Budget(seconds=2.0), cfg, validation=validation)
    wall = time.perf_counter() - started
    events = [r for r in records if r.get("event") == "validation"]
    steps = [r["elapsed_s"] for r in records if "loss" in r]
    longest_step = max(b - a for a, b in zip([0.0, *steps], steps))
    assert events and all(e["val_loss"] == 1.0 and e["step"] > 0 and e["tokens"] > 0 for e in events)
    clocks = [e["elapsed_s"] for e in events]
    passed = [math.floor(c / 0.3 + 1e-9) for c in clocks]  # intervals the budget clock had passed
    assert all(a < b for a, b in zip(passed, passed[1:])) and passed[0] >= 1  # one per interval passed, no more
    assert clocks[-1] < 2.0 + longest_step + 0.05
    assert validation.seconds >= 1.0 * len(events)
    assert wall >= 2.0 + validation.seconds - 0.1  # the budget was trained in full on top of the validations
    assert result["train_seconds"] + result["compile_seconds"] < 2.0 + longest_step + 0.1


def test_periodic_validation_resumes_from_the_saved_clock():
    from cramming.train.heldout import PeriodicHeldout

    validation = PeriodicHeldout(1.0, dict)  # every 60 s
    assert not validation.due(130.0)  # resumed at 2 min 10 s: the next one is at 3 min, not at once
    assert not validation.due(179.0) and validation.due(181.0) and not validation.due(200.0)


def test_loss_goes_down(sanity_data):
    cfg = TrainConfig(batch_size=16, batch_ramp=0.0, max_steps=40, lr=3e-3, schedule="constant")
    _, records = run(sanity_data, Budget(seconds=3600, max_steps=40), cfg)
    first = sum(r["loss"] for r in records[:5]) / 5
    last = sum(r["loss"] for r in records[-5:]) / 5
    assert last < first - 0.3


def test_same_seed_same_run(sanity_data):
    cfg = TrainConfig(batch_size=16, batch_ramp=0.0, max_steps=3)
    _, a = run(sanity_data, Budget(seconds=3600, max_steps=3), cfg)
    _, b = run(sanity_data, Budget(seconds=3600, max_steps=3), cfg)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def test_an_accumulated_step_is_the_step_over_the_whole_batch(sanity_data):
    """train.batch_size=16 as two microbatches of 8 is one step over the same 16 rows: each microbatch's loss is
    divided by the number of microbatches, so the step's loss, its gradient norm (what train.grad_clip reads) and
    its update are the whole batch's mean, as one microbatch of 16 computes them. Next-token prediction, so that
    no mask differs (MLM draws a microbatch's masks from its first row's position)."""
    cfg = TrainConfig(batch_size=16, batch_ramp=0.0, max_steps=1, lr=1e-3, schedule="constant", warmup=0.0)
    logs = [ListLog(), ListLog()]
    (_, (split,)), (_, (whole,)) = [run(sanity_data, Budget(seconds=3600, max_steps=1), cfg, microbatch=micro,
                                        log=log, objective="clm") for micro, log in zip((8, 16), logs)]
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    for a, b in zip(logs[0].model.parameters(), logs[1].model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def open_training_bars() -> list:
    return [bar for bar in list(tqdm._instances) if bar.desc.startswith("training")]


# fp16 with an absurd learning rate: the first step blows the weights up, the next loss is not finite. On CPU too.
ABSURD = {"batch_size": 8, "batch_ramp": 0.0, "lr": 1e6, "schedule": "constant", "warmup": 0.0}


def test_fp16_skip_keeps_the_grad_scaler_usable(sanity_data):
    """After a skipped step the next step's unscale_ must work: the run goes on skipping until train.skip.max_in_row."""
    cfg = TrainConfig(**ABSURD, max_steps=10, nonfinite="skip", skip=SkipConfig(max_in_row=3))
    log = ListLog()
    with pytest.raises(RunStopped, match="3 steps in a row skipped") as stop:
        run(sanity_data, Budget(seconds=3600, max_steps=10), cfg, precision="fp16", log=log)
    assert stop.value.exit_code == 3
    assert [r["event"] for r in log.records if "event" in r] == ["skip"] * 3
    assert not open_training_bars()  # closed on the way out of the exception (its traceback keeps it alive)


def test_fp16_rollback_keeps_the_grad_scaler_usable(sanity_data, tmp_path):
    """Every rollback reloads the scaler's state; the next steps run, and the run finishes its steps."""
    cfg = TrainConfig(**ABSURD, max_steps=4, nonfinite="rollback", rollback=RollbackConfig(lr_factor=0.5))
    result, records = run(sanity_data, Budget(seconds=3600, max_steps=4), cfg, precision="fp16",
                          tmp_dir=tmp_path, save_first=True)
    assert result["steps"] == 4 and result["rollbacks"] >= 1
    rollbacks = [r for r in records if r.get("event") == "rollback"]
    assert len(rollbacks) == result["rollbacks"] and rollbacks[0]["lr_scale"] == 0.5


class PoisonAndStop(ListLog):
    """At step 2: make a weight NaN and send this process SIGTERM, so the stop's checkpoint is refused."""

    def log(self, record):
        super().log(record)
        if record.get("step") == 2 and "loss" in record:
            with torch.no_grad():
                next(self.model.parameters()).view(-1)[0] = float("nan")
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_refused_stop_checkpoint_says_so(sanity_data, tmp_path):
    cfg = TrainConfig(batch_size=8, batch_ramp=0.0, max_steps=6)
    with pytest.raises(RunStopped) as stop:
        run(sanity_data, Budget(seconds=3600, max_steps=6), cfg, tmp_dir=tmp_path, save_first=True,
            log=PoisonAndStop())
    message = str(stop.value)
    assert stop.value.exit_code == 75 and "checkpoint None" not in message
    assert "no checkpoint written, a weight is not finite; the last whole one is " in message
    assert message.split("the last whole one is ")[1].startswith(str(tmp_path / "checkpoints" / "step-00000000"))
    assert not open_training_bars()


def test_ddp_reduces_gradients_only_on_a_steps_last_microbatch():
    """Gradient accumulation under impl.distributed=ddp: DDP's no_sync() holds the all-reduce back on every
    microbatch but the step's last, whose backward then reduces the accumulated sum (one all-reduce per step, and
    every rank steps with the same gradients). The trainer says which microbatch is the last."""
    class Replica:  # what the engine reads of a DistributedDataParallel module: its no_sync() and the flag it sets
        require_backward_grad_sync = True

        @contextlib.contextmanager
        def no_sync(self):
            self.require_backward_grad_sync = False
            try:
                yield
            finally:
                self.require_backward_grad_sync = True

    engine, model, synced = DDP(rank=0, world=2), Replica(), []
    for microbatch in range(4):
        with engine.no_sync(model, last_microbatch=microbatch + 1 == 4):
            synced.append(model.require_backward_grad_sync)
    assert synced == [False, False, False, True]


def test_the_loader_names_the_true_microbatch(sanity_data):
    """train_batches gets microbatch x world rows; the message names impl.microbatch_size, one rank's share."""
    folder, meta = sanity_data
    rows = meta["train_sequences"]
    with pytest.raises(UserError) as err:
        train_batches(folder, meta, "random", 0, 2 * rows, 0, False, world=2)
    assert f"impl.microbatch_size={rows} x 2 processes" in str(err.value)


def test_tokens_per_s_is_tokens_over_the_reported_train_seconds(tmp_path):
    summary = pretrain(config_for(*TINY, "train.max_steps=5", "train.batch_size=16", "impl.microbatch_size=8",
                                  "train.schedule=step-constant"), tmp_path)
    spent = summary["wall_seconds"]
    assert summary["steps"] == 5 and spent["compile"] > 0
    # wall_seconds are rounded to 1 ms, so the quotient is only as exact as that rounding
    fastest, slowest = summary["tokens"] / (spent["train"] - 5e-4), summary["tokens"] / (spent["train"] + 5e-4)
    assert slowest <= summary["tokens_per_s"] <= fastest


def test_the_summary_reports_the_kernels_autotune_seconds(tmp_path, monkeypatch):
    """wall_seconds.autotune is what the Triton wrappers counted (CPU runs tune nothing, so fake a count)."""
    import cramming.train_summary

    monkeypatch.setattr(cramming.train_summary, "autotune_seconds", lambda: 12.3456)
    summary = pretrain(config_for(*TINY, "train.max_steps=2", "train.batch_size=8",
                                  "train.schedule=step-constant"), tmp_path)
    assert summary["wall_seconds"]["autotune"] == 12.346


@pytest.mark.parametrize("microbatch", ["8", "auto"])
def test_the_summary_says_the_microbatch_the_kernels_and_the_peak_memory(microbatch, tmp_path, monkeypatch):
    """The GPU day's figures (issue 25): the microbatch used (as given, or as auto chose it), the kernels the
    runtime resolved, and the CUDA memory peak (null off CUDA; CUDA faked here to see the reading)."""
    import cramming.pretraining
    import cramming.train_summary

    monkeypatch.setattr(cramming.pretraining, "auto_microbatch", lambda *args, **kwargs: 4)
    summary = pretrain(config_for(*TINY, "train.max_steps=2", "train.batch_size=8", "train.schedule=step-constant",
                                  f"impl.microbatch_size={microbatch}"), tmp_path)
    assert summary["microbatch"] == (8 if microbatch == "8" else 4)
    assert summary["kernels"] == {"attention": "sdpa", "rotary": "torch", "loss": "fused"}
    assert summary["peak_memory_gib"] is None
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30 + 2**29)
    assert cramming.train_summary.peak_memory_gib(torch.device("cuda", 0)) == 3.5


class Recorder(Hook):
    """Writes down each moment the loop calls it at."""

    def __init__(self):
        self.moments = []

    def on_begin(self, trainer, state):
        self.moments.append("begin")

    def on_step(self, trainer, state):
        self.moments.append(f"step {state.step}")

    def on_between(self, trainer, state):
        self.moments.append("between")

    def on_pause(self):
        self.moments.append("pause")

    def on_resume(self):
        self.moments.append("resume")

    def on_end(self, trainer, state):
        self.moments.append("end")


def test_hooks_are_called_in_turn_at_their_moments(sanity_data):
    """The loop's protocol (train/hooks.py): begin, then per applied step `on_step` and `on_between`, a pause
    and resume around every validation (an earlier hook's time that is not budget time), end last."""
    from cramming.train.heldout import PeriodicHeldout

    recorder = Recorder()
    validation = PeriodicHeldout(1e-9, lambda: time.sleep(0.01) or {"val_loss": 1.0})  # due after every step
    cfg = TrainConfig(batch_size=8, batch_ramp=0.0, max_steps=3)
    result, records = run(sanity_data, Budget(seconds=3600, max_steps=3), cfg, validation=validation,
                          hooks=[recorder])
    assert result["steps"] == 3
    # the first check only marks where the clock is; then the validation (the first hook) pauses every hook
    validated = ["pause", "resume", "between"]
    assert recorder.moments == ["begin", "step 1", "between", "step 2", *validated, "step 3", *validated, "end"]
    assert sum(r.get("event") == "validation" for r in records) == 2


def test_a_nonfinite_policy_returns_the_action_the_trainer_carries_out():
    from cramming.train.nonfinite import NONFINITE, Halt, Rollback, Skip

    cfg = TrainConfig(skip=SkipConfig(max_in_row=7), rollback=RollbackConfig(lr_factor=0.25))
    assert NONFINITE["skip"](cfg) == Skip(7)
    assert NONFINITE["rollback"](cfg) == Rollback(0.25)
    assert isinstance(NONFINITE["halt"](cfg), Halt)
