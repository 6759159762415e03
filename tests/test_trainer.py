"""The budget loop: it ends on time even inside a large accumulated step, and it learns."""

import contextlib

import pytest
import torch

from cramming.config import ArchConfig, DataConfig, TrainConfig
from cramming.data.loader import train_batches
from cramming.data.prepare import prepare_data
from cramming.impl import Runtime
from cramming.pretraining import build_model
from cramming.train.masking import PositionalMasks
from cramming.train.objectives import build_objective
from cramming.train.optim import build_optimizer
from cramming.train.resume import Checkpointer
from cramming.train.state import TrainState
from cramming.train.trainer import Budget, train


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


def run(data, budget, train_cfg, microbatch=8, seed=0, tmp_dir="/nonexistent-never-written"):
    folder, meta = data
    torch.manual_seed(seed)
    arch = ArchConfig(num_layers=2, hidden_size=64, num_heads=4, ffn_size=128, max_seq_length=32)
    cpu = torch.device("cpu")
    model = build_model(arch, meta["vocab_size"], meta["special_ids"], Runtime(cpu, "fp32", False, "sdpa", "torch"))
    optimizer = build_optimizer(model, train_cfg, torch.device("cpu"))
    batches = train_batches(folder, meta, "random", seed, microbatch, 0, False)
    log = ListLog()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    objective = build_objective("mlm", train_cfg, meta, cpu)
    masks = PositionalMasks(seed, cpu)
    checkpointer = Checkpointer(tmp_dir, None, 1, {})
    result = train(model, optimizer, batches, objective, meta, train_cfg, microbatch, budget, cpu,
                   contextlib.nullcontext, scaler, log, TrainState(), masks, checkpointer)
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
