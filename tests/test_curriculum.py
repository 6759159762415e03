"""The sequence-length curriculum: stages switch at the right fraction, long sequences are the same stream
joined, and a whole epoch covers every token exactly once whatever the stage."""

import json

import numpy as np
import torch
from conftest import REPO
from hydra import compose, initialize_config_dir

from cramming.data.loader import EndlessOrder
from cramming.data.packed import PackedTokens
from cramming.pretraining import pretrain
from cramming.train.curriculum import block_rows, factor_at, regroup, sequence_length, stage_factors
from cramming.validation import load_config


def config_for(*overrides):
    base = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
            "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=base + list(overrides)))


def test_stages_switch_at_their_fractions():
    stages = stage_factors([[0.9, 128], [0.1, 512]], 128)
    assert stages == [(0.9, 1), (1.0, 4)] and block_rows(stages) == 4
    assert [factor_at(stages, p) for p in (0.0, 0.89, 0.9, 0.99, 1.0)] == [1, 1, 4, 4, 4]
    assert stage_factors(None, 128) == [(1.0, 1)]
    assert block_rows(stage_factors([[0.5, 64], [0.3, 128], [0.2, 192]], 64)) == 6
    assert sequence_length(128, 4) == 509


def test_joined_rows_are_the_stream_itself(tmp_path):
    stream = np.arange(10, 10 + 7 * 12, dtype=np.uint16)  # 12 rows of 7 stream tokens (seq_length 8)
    stream.tofile(tmp_path / "train.bin")
    rows = torch.from_numpy(PackedTokens(tmp_path / "train.bin", np.uint16, 8, cls_id=2).rows(range(8)))
    joined = regroup(rows, 4)
    assert joined.shape == (2, 29)
    assert joined[:, 0].tolist() == [2, 2]
    assert torch.equal(joined[:, 1:].reshape(-1), torch.from_numpy(stream[:56].astype(np.int64)))


def test_one_epoch_covers_every_row_once_across_a_stage_switch(tmp_path):
    rows = 4 * 25
    order = EndlessOrder(tmp_path, rows, "random", seed=3, block=4)
    it = iter(order)
    epoch = [next(it) for _ in range(rows)]
    assert sorted(epoch) == list(range(rows))
    assert all(epoch[i:i + 4] == list(range(epoch[i], epoch[i] + 4)) for i in range(0, rows, 4))  # blocks kept
    resumed = iter(EndlessOrder(tmp_path, rows, "random", seed=3, start=40, block=4))
    assert [next(resumed) for _ in range(60)] == epoch[40:]  # a resumed stream continues exactly


def test_a_run_switches_length_and_keeps_tokens_per_step(tmp_path):
    summary = pretrain(config_for("train.seq_schedule=[[0.5,32],[0.5,64]]", "train.schedule=step-constant",
                                  "train.warmup=0", "train.max_steps=4", "train.batch_size=16",
                                  "impl.microbatch_size=8", "train.batch_ramp=0"), tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["seq_length"] for r in steps] == [32, 32, 63, 63]
    per_step = np.diff([0] + [r["tokens"] for r in steps])
    assert per_step.tolist() == [16 * 32, 16 * 32, 8 * 63, 8 * 63]  # the same 16 rows of the stream each step
    assert summary["steps"] == 4
