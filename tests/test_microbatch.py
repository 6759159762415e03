"""impl.microbatch_size=auto: candidates divide the batch, the search keeps the largest that fits, and on CPU
auto is a fixed size (memory is not the limit there)."""

import contextlib

import pytest
import torch
from conftest import REPO
from hydra import compose, initialize_config_dir

from cramming.config import load_config
from cramming.errors import UserError
from cramming.model import CrammedConfig, CrammedForMaskedLM
from cramming.pretraining import pretrain
from cramming.train.microbatch import CPU_MICROBATCH, candidates, largest_fitting, probe_fits


def config_for(*overrides):
    base = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
            "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=base + list(overrides)))


def test_candidates_divide_the_batch_and_respect_the_block():
    assert candidates(8192, 1)[-3:] == [2048, 4096, 8192] and len(candidates(8192, 1)) == 14
    assert candidates(48, 4) == [4, 8, 12, 16, 24, 48]


def test_largest_fitting_stops_at_the_first_failure():
    assert largest_fitting([4, 8, 16, 32, 64], lambda m: m <= 20) == 16
    assert largest_fitting([4, 8], lambda m: False) == 4
    assert largest_fitting([4, 8], lambda m: True) == 8


def test_probe_runs_forward_backward_and_leaves_model_and_rng_alone():
    model = CrammedForMaskedLM(CrammedConfig(vocab_size=97, hidden_size=32, num_layers=1, num_heads=4, ffn_size=64))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    assert probe_fits(model, 97, 16, contextlib.nullcontext, ballast_numel=10)(4)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_auto_on_cpu(tmp_path, capsys):
    summary = pretrain(config_for("impl.microbatch_size=auto", "train.batch_size=64", "train.max_steps=2"), tmp_path)
    assert f"microbatch: {min(CPU_MICROBATCH, 64)} sequences (impl.microbatch_size=auto)" in capsys.readouterr().out
    assert summary["steps"] == 2


def test_auto_validation():
    with pytest.raises(UserError, match="impl.microbatch_size"):
        config_for("impl.microbatch_size=big")
    with pytest.raises(UserError, match="multiple of 2"):
        config_for("impl.microbatch_size=auto", "train.batch_size=63", "train.seq_schedule=[[0.5,32],[0.5,64]]")
