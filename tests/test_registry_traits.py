"""Typed registry entries: each registry declares its traits, an undeclared one is refused when registering and when
reading, traits are opt-in (False unless the entry says so, by registration or class attribute), and the checks
that used to test names ask the trait and list, from the registry, the entries that have it."""

import json
from types import SimpleNamespace

import pytest

from cramming.config import PretrainConfig
from cramming.engines import ENGINES
from cramming.engines.deepspeed import DeepSpeed
from cramming.engines.deepspeed import problem as deepspeed_problem
from cramming.model import CrammedConfig
from cramming.model.arch import ArchConfig
from cramming.model.block import BLOCKS, TransformerBlock, cache_problem
from cramming.model.ffn import FFNS
from cramming.model.linear import LINEARS
from cramming.model.patterns import PATTERNS, Global
from cramming.model.positions import POSITIONS, PositionScheme
from cramming.registry import Registry
from cramming.run import build_model
from cramming.train.nonfinite import NONFINITE
from cramming.train.objectives import OBJECTIVES
from cramming.train.optim import OPTIMIZERS
from cramming.validation.across import (
    block_projections,
    engine_optimizer_problem,
    masking_problem,
    token_dropping_problem,
    zero_init_problem,
)


def things() -> Registry:
    return Registry("thing", traits={"fast": "it is fast", "small": "it is small"})


def test_an_undeclared_trait_is_refused_when_registering_and_nothing_is_added():
    registry = things()
    with pytest.raises(KeyError, match=r"the thing registry declares no trait 'fsat' \(its traits: fast, small\)"):
        registry.register("a", fsat=True)
    with pytest.raises(KeyError, match="declares no trait 'fast'"):
        Registry("plain").register_one("b", fast=True)
    assert "a" not in registry


def test_an_undeclared_trait_is_refused_when_reading():
    registry = things()
    registry.register("a", fast=True)(lambda: None)
    for read in (lambda: registry.trait("a", "fsat"), lambda: registry.having("fsat"),
                 lambda: registry.lacking("fsat"), lambda: BLOCKS.trait("attention", "kv_cahce")):
        with pytest.raises(KeyError, match="declares no trait"):
            read()


def test_traits_are_opt_in():
    registry = things()
    registry.register("quick", fast=True)(lambda: None)
    registry.register("plain")(lambda: None)
    assert registry.trait("quick", "fast") is True and registry.trait("plain", "fast") is False
    assert registry.trait("plain", "small") is False and registry.trait("unknown", "fast") is False
    assert registry.having("fast") == ["quick"] and registry.lacking("fast") == ["plain"]
    assert registry.choices("fast", has=False) == "plain"


def test_a_class_attribute_is_the_trait_and_an_undeclared_one_is_refused():
    registry = things()

    @registry.register_one("cls")
    class Fast:
        fast = True

    assert registry.trait("cls", "fast") and registry.trait(registry["cls"], "fast")
    assert BLOCKS.trait("attention", "kv_cache") and TransformerBlock.kv_cache
    with pytest.raises(KeyError, match=r"thing 'typo' sets fsat, which the thing registry does not declare"):
        @registry.register("typo")
        class Typo:
            fsat = True
    assert "typo" not in registry


def test_a_block_that_takes_a_cache_is_not_refused_one(monkeypatch):
    class Cached(TransformerBlock):
        """The attention block under another name: what it inherits says it takes a cache."""

    layout = ArchConfig(layout=["attention", "cached"])
    monkeypatch.setitem(BLOCKS, "cached", Cached)
    assert cache_problem(layout) is None
    monkeypatch.setattr(Cached, "kv_cache", False)
    assert cache_problem(layout).startswith("no KV cache for arch.layout=['attention', 'cached']: cached blocks keep "
                                            "no keys and values (only attention blocks do)")


def dropping(**arch) -> PretrainConfig:
    config = PretrainConfig()
    config.arch.token_dropping.keep = 0.5
    for key, value in arch.items():
        setattr(config.arch, key, value)
    return config


def test_token_dropping_asks_the_position_scheme_and_lists_those_that_travel(monkeypatch):
    class Opaque(PositionScheme):
        """A scheme that does not say its positions travel with the tokens: opt-in, so refused."""

    monkeypatch.setitem(POSITIONS, "opaque", Opaque())
    refused = token_dropping_problem(dropping(position="opaque"))
    assert refused == ("arch.token_dropping.keep=0.5 is invalid: needs positions that travel with the tokens "
                       "(learned, none, rotary, scaled-sinusoidal, sinusoidal), not arch.position=opaque")
    monkeypatch.setattr(Opaque, "token_subsets", True)
    assert token_dropping_problem(dropping(position="opaque")) is None
    monkeypatch.setattr(POSITIONS["rotary"], "token_subsets", False, raising=False)
    assert "(learned, none, opaque, scaled-sinusoidal, sinusoidal)" in token_dropping_problem(dropping(position="rotary"))


def test_token_dropping_lists_the_patterns_and_blocks_that_have_the_trait(monkeypatch):
    monkeypatch.setitem(PATTERNS, "everything", Global())
    local = dropping(position="rotary")
    local.arch.attention.pattern = ["local"]
    assert token_dropping_problem(local).endswith("use everything, global or topk")
    gmlp = dropping(position="rotary", layout=["attention", "gmlp"])
    assert token_dropping_problem(gmlp).endswith("use only attention blocks in arch.layout")
    monkeypatch.setattr(BLOCKS["gmlp"], "token_subsets", True, raising=False)
    assert token_dropping_problem(gmlp) is None


def test_structured_linear_layers_are_refused_zero_init_by_their_trait(monkeypatch):
    config = PretrainConfig()
    config.arch.zero_init_out, config.arch.linear, config.arch.linear_on = True, "lowrank", ["ffn"]
    assert zero_init_problem(config).endswith("use arch.linear=dense")
    monkeypatch.setattr(LINEARS["lowrank"], "structured", False)
    assert zero_init_problem(config) is None
    config.arch.linear = "monarch"
    assert zero_init_problem(config).endswith("use arch.linear=dense or lowrank")


def test_a_gated_ffn_halves_the_down_projection(monkeypatch):
    arch = ArchConfig(ffn="mlp", hidden_size=32, ffn_size=64)
    assert block_projections(arch)["ffn"] == [(32, 64), (64, 32)]
    monkeypatch.setattr(FFNS["mlp"], "gated", True, raising=False)
    assert block_projections(arch)["ffn"] == [(32, 64), (32, 32)]


def test_whole_word_masking_asks_whether_the_objective_masks(monkeypatch):
    config = PretrainConfig()
    config.arch.objective, config.train.masking = "clm", "whole-word"
    assert masking_problem(config).endswith("(or choose arch.objective=mlm or rtd)")
    monkeypatch.setattr(OBJECTIVES["clm"], "masks_tokens", True, raising=False)
    assert masking_problem(config) is None


def built_config(objective: str) -> CrammedConfig:
    arch = ArchConfig(objective=objective, hidden_size=32, num_heads=4, ffn_size=64, num_layers=2)
    runtime = SimpleNamespace(attention="sdpa", rotary="torch", loss="plain")
    return build_model(arch, 97, {"pad": 0, "cls": 2, "sep": 3, "mask": 4}, runtime).config


def test_the_config_built_for_an_objective_says_its_causal_trait():
    assert {n: built_config(n).causal for n in OBJECTIVES} == {n: OBJECTIVES.trait(n, "causal") for n in OBJECTIVES}


def test_a_new_causal_objective_needs_no_name_in_the_model(tmp_path, monkeypatch):
    """An objective that says `causal` gets a causal model, and its saved config.json answers so without the
    objectives: the model folder never tests an objective's name (this one is new to it)."""
    monkeypatch.setitem(OBJECTIVES, "prefix-lm", OBJECTIVES["clm"])  # the clm objective under a new name
    config = built_config("prefix-lm")
    assert config.causal and config.objective == "prefix-lm"
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["causal"] is True
    assert CrammedConfig.from_pretrained(tmp_path).causal is True
    monkeypatch.setattr(OBJECTIVES["clm"], "causal", False)  # the trait says no: the next-token head refuses
    with pytest.raises(ValueError, match="objective 'prefix-lm', whose attention is bidirectional"):
        built_config("prefix-lm")


@pytest.mark.parametrize("objective, causal", [("clm", True), ("mlm", False), ("rtd", False)])
def test_a_config_saved_before_it_said_causal_reads_as_its_objective_did(objective, causal, tmp_path):
    """config.json files written before `causal` was stored lack the key; so do configs built by hand."""
    CrammedConfig(objective=objective).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.pop("causal", None)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert CrammedConfig.from_pretrained(tmp_path).causal is causal
    assert CrammedConfig(objective=objective).causal is causal
    assert CrammedConfig(objective=objective, causal=not causal).causal is (not causal)


def onebit(optimizer: str) -> PretrainConfig:
    config = PretrainConfig()
    config.impl.distributed, config.train.optim.name = "deepspeed", optimizer
    config.impl.deepspeed.onebit_adam, config.impl.deepspeed.zero_stage = True, 0
    return config


def test_onebit_adam_stands_in_for_optimizers_with_the_adamw_trait(monkeypatch):
    assert DeepSpeed.settings_problem(onebit("sgd")) is None  # its own settings are fine; the optimizer is across
    assert engine_optimizer_problem(onebit("adamw")) is None
    assert engine_optimizer_problem(onebit("sgd")).endswith("leave train.optim.name=adamw")
    monkeypatch.setattr(OPTIMIZERS["sgd"], "adamw", True, raising=False)
    assert engine_optimizer_problem(onebit("sgd")) is None


def test_deepspeed_asks_whether_the_nonfinite_policy_continues(monkeypatch):
    """validation.across.run_problem asks the policy's trait and the engine whether it checks every gradient."""
    from cramming.validation.across import run_problem

    config = PretrainConfig()
    config.impl.deepspeed.zero_stage, config.train.nonfinite = 0, "halt"
    bf16 = SimpleNamespace(precision="bf16")
    engine = DeepSpeed()
    assert deepspeed_problem(config, bf16, 8) is None and run_problem(config, engine, bf16) is None
    monkeypatch.setattr(NONFINITE["halt"], "continues", True, raising=False)
    assert run_problem(config, engine, bf16).endswith("or train.nonfinite=rollback")
    assert run_problem(config, engine, SimpleNamespace(precision="fp16")) is None  # fp16's scaler checks them


def test_engine_traits_decide_and_list(monkeypatch):
    from cramming.train.averaging import AVERAGING

    averaging = next(entry for entry in AVERAGING.values() if entry is not None)
    config = PretrainConfig()
    config.impl.distributed = "fsdp2"
    assert averaging.problem(config).endswith("use impl.distributed=ddp or none, or train.averaging=none")
    monkeypatch.setattr(ENGINES["ddp"], "shards_weights", True, raising=False)
    assert averaging.problem(config).endswith("use impl.distributed=none, or train.averaging=none")
    config.impl.distributed = "none"
    assert averaging.problem(config) is None
