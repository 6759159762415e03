"""The checks ask a registered entry's traits, never its name: flipping a trait flips the decision, and the
messages list the entries that have it."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cramming.config import load_config
from cramming.engines.base import whole_matrices
from cramming.errors import UserError
from cramming.model.block import BLOCKS
from cramming.train.optim import OPTIMIZERS

CONF = Path(__file__).resolve().parents[1] / "conf"


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=["arch=gpt-tiny", *overrides]))


def test_mup_takes_any_optimizer_with_normalised_updates(monkeypatch):
    with pytest.raises(UserError, match="use one of adamw, lion or arch.parametrization=standard"):
        config_for("arch.parametrization=mup", "train.optim.name=sgd")
    monkeypatch.setattr(OPTIMIZERS["sgd"], "normalised_updates", True, raising=False)
    config_for("arch.parametrization=mup", "train.optim.name=sgd")
    monkeypatch.setattr(OPTIMIZERS["lion"], "normalised_updates", False)
    with pytest.raises(UserError, match="train.optim.name='lion' is invalid: .* use one of adamw, sgd or"):
        config_for("arch.parametrization=mup", "train.optim.name=lion")


def test_mup_takes_the_blocks_it_scales(monkeypatch):
    with pytest.raises(UserError, match="does not scale gmlp blocks .* use only attention blocks"):
        config_for("arch.parametrization=mup", "arch.layout=[attention,gmlp]")
    monkeypatch.setattr(BLOCKS["gmlp"], "width_scaled", True)
    config_for("arch.parametrization=mup", "arch.layout=[attention,gmlp]")
    monkeypatch.setattr(BLOCKS["attention"], "width_scaled", False)
    with pytest.raises(UserError, match="does not scale attention blocks .* use only gmlp blocks"):
        config_for("arch.parametrization=mup", "arch.layout=[attention,gmlp]")


def test_value_embeddings_need_blocks_that_take_them(monkeypatch):
    with pytest.raises(UserError, match="use only attention blocks in arch.layout"):
        config_for("arch.value_embeddings=1", "arch.layout=[gmlp,attention]")
    monkeypatch.setattr(BLOCKS["gmlp"], "takes_value_embedding", True, raising=False)
    config_for("arch.value_embeddings=1", "arch.layout=[gmlp,attention]")


def test_a_fixed_length_block_bounds_the_curriculum(monkeypatch):
    long = ["arch.position=rotary", "arch.max_seq_length=128", "data.seq_length=64",
            "train.seq_schedule=[[0.5,64],[0.5,256]]"]
    config_for(*long)
    monkeypatch.setattr(BLOCKS["attention"], "fixed_length", True, raising=False)
    with pytest.raises(UserError, match="rotary positions and attention do not extrapolate"):
        config_for(*long)


def test_sharded_engines_ask_whether_the_update_reads_whole_matrices(monkeypatch):
    assert whole_matrices("muon") and not whole_matrices("adamw") and not whole_matrices("unknown")
    monkeypatch.setattr(OPTIMIZERS["adamw"], "whole_matrices", True, raising=False)
    assert whole_matrices("adamw")
