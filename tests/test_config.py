"""Every config group option composes and validates (the refusals of bad values, one line naming the key: the
table in tests/test_refusals.py)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cramming.errors import UserError
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = {group: sorted(p.stem for p in (CONF / group).glob("*.yaml")) for group in ("arch", "data", "train", "impl")}


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="pretrain", overrides=list(overrides))


def test_groups_have_documented_options():
    assert {"crammed-bert", "bert-base", "crammed-bert-tiny", "crammed-bert-mini", "gpt-small",
            "gpt-tiny"} <= set(GROUPS["arch"])
    assert {"python-docs", "local-text", "sanity", "wikitext-103", "bookcorpus-wikipedia", "the-pile",
            "fineweb-edu"} <= set(GROUPS["data"])
    assert {"budget-o4", "cpu-smoke"} <= set(GROUPS["train"])
    assert {"auto", "gpu", "cpu"} <= set(GROUPS["impl"])


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_option_composes_and_validates(group, option):
    extra = ["data.path=somewhere.txt"] if option == "local-text" else []
    config = load_config(compose_config(f"{group}={option}", *extra))
    assert config.arch.hidden_size % config.arch.num_heads == 0


def test_gpt_presets_are_causal_decoders():
    for preset, dims in (("gpt-small", (12, 768, 12, 3072)), ("gpt-tiny", (4, 256, 4, 1024))):
        a = load_config(compose_config(f"arch={preset}")).arch
        assert (a.num_layers, a.hidden_size, a.num_heads, a.ffn_size) == dims
        assert (a.objective, a.ffn, a.position, a.rotary.pct) == ("clm", "mlp", "rotary", 0.25)


def test_crammed_bert_is_the_cramming_recipe():
    c = load_config(compose_config())
    a, t = c.arch, c.train
    assert (a.num_layers, a.hidden_size, a.num_heads, a.ffn_size) == (16, 768, 12, 3072)
    assert (a.ffn, a.norm_position, a.bias, a.position, a.tie_embeddings) == ("glu", "pre", False, "scaled-sinusoidal", True)
    assert a.embedding_norm and a.final_norm and a.sparse_prediction
    assert (t.lr, tuple(t.betas), t.eps, t.weight_decay, t.grad_clip) == (1e-3, (0.9, 0.98), 1e-12, 0.01, 0.5)
    assert (t.batch_size, t.batch_ramp, t.schedule, t.mask_prob) == (8192, 0.6, "budget-triangle", 0.25)
    assert c.budget == 24.0 and c.data.seq_length == 128 and c.data.vocab_size == 32768


def test_cuda_requested_without_gpu_is_a_clear_error():
    import torch

    from cramming import impl

    config = load_config(compose_config("impl=gpu"))
    if torch.cuda.is_available():
        assert impl.resolve(config.impl).device.type == "cuda"
    else:
        with pytest.raises(UserError, match="no CUDA device"):
            impl.resolve(config.impl)


def test_auto_impl_resolves_to_this_machine():
    import torch

    from cramming import impl

    runtime = impl.resolve(load_config(compose_config("impl=auto")).impl)
    assert runtime.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert runtime.compile == (runtime.device.type == "cuda")


@pytest.mark.parametrize("cramming,xdg,expected", [
    ("/some/shared/cache", "/xdg", "/some/shared/cache"),  # $CRAMMING_CACHE first
    (None, "/xdg", "/xdg/cramming"),  # else $XDG_CACHE_HOME/cramming
    (None, None, "{home}/.cache/cramming"),  # else ~/.cache/cramming: runs from any directory share it
])
def test_cache_dir_default_is_one_truth(monkeypatch, tmp_path, cramming, xdg, expected):
    """The schema's default, read when the config is composed (and by the dataclass alike)."""
    from cramming.config import DataConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in (("CRAMMING_CACHE", cramming), ("XDG_CACHE_HOME", xdg)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    expected = expected.format(home=tmp_path)
    assert DataConfig().cache_dir == expected
    assert load_config(compose_config()).data.cache_dir == expected


def test_rules_read_as_they_are_declared():
    from cramming.rules import rule_problem

    assert rule_problem("k", 0.0, "[0, 1)") is None and rule_problem("k", 1.0, "(0, 1]") is None
    assert rule_problem("k", 1.0, "[0, 1)") == "k=1.0 is invalid: must be in [0, 1)"
    assert rule_problem("k", 0, "(0, 1]") == "k=0 is invalid: must be in (0, 1]"
    assert rule_problem("k", None, "> 0 or null") is None
    assert rule_problem("k", None, "> 0") == "k=None is invalid: must be > 0"
    assert rule_problem("k", 0, ">= 1") == "k=0 is invalid: must be >= 1" and rule_problem("k", 1, ">= 1") is None
    assert rule_problem("k", True, "> 0") is not None  # a bool is not a number here
    assert rule_problem("k", (0.9, 1.0), "each [0, 1)") == "k=(0.9, 1.0) is invalid: each must be in [0, 1)"
    assert rule_problem("k", ["a", "c"], ("a", "b")) == "k='c' is not a valid option; choose one of: a, b"


def test_every_declared_rule_names_a_field_and_is_readable():
    import dataclasses

    from cramming.config import PretrainConfig
    from cramming.rules import declared_rules

    def classes(cls):
        yield cls
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
                yield from classes(f.default_factory)

    for cls in classes(PretrainConfig):
        assert set(getattr(cls, "RULES", {})) <= {f.name for f in dataclasses.fields(cls)}, cls
    declared = {key: rule for key, _, rule in declared_rules(PretrainConfig())}
    assert declared["arch.hidden_dropout"] == "[0, 1)" and declared["train.betas"] == "each [0, 1)"
    assert len(declared) >= 30
