"""The checks ask a registered entry's traits, never its name: flipping a trait flips the decision, and the
messages list the entries that have it."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cramming.errors import UserError
from cramming.model.block import BLOCKS
from cramming.train.optim import OPTIMIZERS
from cramming.validation import load_config
from cramming.validation.across import engine_optimizer_problem

CONF = Path(__file__).resolve().parents[1] / "conf"


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=["arch=gpt-tiny", *overrides]))


MUP = "arch.parametrization=mup"
GMLP_TOO = [MUP, "arch.layout=[attention,gmlp]"]


@pytest.mark.parametrize("registry,trait,first,refused,grant,revoke,then,refused_then", [
    (OPTIMIZERS, "normalised_updates", [MUP, "train.optim.name=sgd"], "use one of adamw, lion or", "sgd", "lion",
     [MUP, "train.optim.name=lion"], "train.optim.name='lion' is invalid: .* use one of adamw, sgd or"),
    (BLOCKS, "width_scaled", GMLP_TOO, "does not scale gmlp blocks .* use only attention blocks", "gmlp",
     "attention", GMLP_TOO, "does not scale attention blocks .* use only gmlp blocks"),
], ids=["optimizer", "block"])
def test_mup_asks_the_trait(monkeypatch, registry, trait, first, refused, grant, revoke, then, refused_then):
    """Granting the trait lets an entry in; taking it away shuts one out, and the message lists who has it."""
    with pytest.raises(UserError, match=refused):
        config_for(*first)
    monkeypatch.setattr(registry[grant], trait, True, raising=False)
    config_for(*first)
    monkeypatch.setattr(registry[revoke], trait, False)
    with pytest.raises(UserError, match=refused_then):
        config_for(*then)


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
    from cramming.config import PretrainConfig

    def run(optimizer, engine="fsdp2"):
        config = PretrainConfig()
        config.impl.distributed, config.train.optim.name = engine, optimizer
        return engine_optimizer_problem(config)

    assert "cannot run under impl.distributed=fsdp2" in run("muon") and run("adamw") is None
    assert run("muon", "ddp") is None  # ddp keeps the optimizer state whole
    monkeypatch.setattr(OPTIMIZERS["adamw"], "whole_matrices", True, raising=False)
    assert "cannot run under impl.distributed=fsdp2" in run("adamw")
