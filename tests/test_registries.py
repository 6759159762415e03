"""Option names map to registered objects that carry their behaviour: a new position scheme, attention pattern or
schedule is one class plus one registry line, and the model, the attention and config validation ask the object."""

import json
from types import SimpleNamespace

import pytest
import torch

from cramming.config import PretrainConfig
from cramming.errors import UserError
from cramming.eval.finetune import FINETUNE_SCHEDULES
from cramming.model import CrammedConfig, CrammedForMaskedLM
from cramming.model.arch import ArchConfig, AttentionConfig
from cramming.model.attention import ATTENTION_KERNELS, eager_attention, kernel_problem
from cramming.model.patterns import PATTERNS
from cramming.model.positions import POSITIONS, LearnedPositions, PositionScheme
from cramming.model.sparse_patterns import Local
from cramming.run import build_model
from cramming.train.objectives import OBJECTIVES
from cramming.train.schedule import SCHEDULES
from cramming.validation import validate

TINY = {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "ffn_size": 64, "max_seq_length": 16,
        "attention_impl": "eager", "hidden_dropout": 0.0, "attention_dropout": 0.0}


class LearnedWithALiBi(PositionScheme):
    """A scheme no built-in combines: a learned table and ALiBi's bias."""

    table = LearnedPositions
    alibi = True

    def problem(self, config):
        return "arch.position=learned-alibi is invalid: refused by its own problem()"


def test_a_new_position_scheme_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(POSITIONS, "learned-alibi", LearnedWithALiBi())
    model = CrammedForMaskedLM(CrammedConfig(**TINY, position="learned-alibi"))
    assert isinstance(model.encoder.positions, LearnedPositions)
    assert all(layer.attn.spec.alibi and layer.attn.rotary is None for layer in model.encoder.layers)
    assert model.encoder.score_bias is None

    config = PretrainConfig()
    config.arch.position = "learned-alibi"
    with pytest.raises(UserError, match=r"refused by its own problem\(\)"):
        validate(config)


class Wide(Local):
    """A local window twice arch.attention.window wide."""

    def kernel_args(self, config):
        return {"window": 2 * config.attention.window}


def test_a_new_attention_pattern_is_one_class_and_one_registry_line(monkeypatch):
    monkeypatch.setitem(PATTERNS, "wide", Wide())
    torch.manual_seed(0)
    model = CrammedForMaskedLM(CrammedConfig(**{**TINY, "num_layers": 1}, attention_pattern=["wide"], attention_window=2))
    attn = model.encoder.layers[0].attn
    assert attn.spec.window == 4 and attn.spec.stepped is None
    x = torch.randn(2, 16, 32)
    seen = []
    attn.kernel = lambda q, k, v, spec: seen.append(spec) or eager_attention(q, k, v, spec)
    attn(x)
    assert seen[0].window == 4
    # its problem() is the local one, asked by validation with the doubled window unknown to it: window 200 > 128
    config = PretrainConfig()
    config.arch.attention.pattern, config.arch.attention.window = ["wide"], 200
    with pytest.raises(UserError, match=r"arch.attention.window=200 is invalid: must be in \[1, data.seq_length=128\]"):
        validate(config)


def test_patterns_refuse_at_every_curriculum_length():
    """A stepped block that divides data.seq_length but not a longer stage's length is refused, naming the stage."""
    config = PretrainConfig()
    config.data.seq_length, config.arch.position, config.impl.microbatch_size = 32, "rotary", 8
    config.arch.attention.pattern, config.arch.attention.window = ["local"], 16
    config.train.seq_schedule = [[0.5, 32], [0.5, 64]]  # the 64 stage: two rows joined, 63 tokens
    validate(config)
    config.arch.attention.pattern = ["local", "stepped"]
    with pytest.raises(UserError, match=r"train.seq_schedule=.*divides the stage length=63"):
        validate(config)


def test_each_schedule_knows_what_drives_it():
    assert {name for name, s in SCHEDULES.items() if s.by_steps} == {n for n in SCHEDULES if n.startswith("step-")}
    # the cool-down check belongs to the shape with a cool-down, whichever clock drives it
    for name in ("budget-wsd", "step-wsd"):
        assert "must fit in the run" in SCHEDULES[name].problem(0.6, 0.6, 10)
    assert SCHEDULES["step-cosine"].problem(0.6, 0.6, 10) is None


@pytest.mark.parametrize("name,expected", [
    ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]),
    ("cosine", [0.0, 0.5, 1.0, 0.8535534, 0.5, 0.1464466]),
])
def test_finetune_schedules_warm_up_then_follow_their_shape(name, expected):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = FINETUNE_SCHEDULES[name].build(optimizer, warmup_steps=2, total_steps=6)
    rates = []
    for _ in range(6):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx(expected)


def test_the_objective_names_its_head():
    assert OBJECTIVES["mlm"].head is CrammedForMaskedLM and OBJECTIVES["clm"].head.__name__ == "CrammedForCausalLM"
    assert {name: CrammedConfig(objective=name).causal for name in OBJECTIVES} == {"mlm": False, "clm": True, "rtd": False}


def test_a_kernel_refuses_exactly_the_arguments_it_does_not_serve():
    """impl.attention's refusals come from what each kernel declares it computes, not from pattern names."""

    def narrow(q, k, v, spec):
        raise AssertionError("never called")

    narrow.serves, narrow.fit_problem = frozenset({"window"}), None
    mixed = ArchConfig(attention=AttentionConfig(pattern=["local", "stepped"]))
    assert kernel_problem(ATTENTION_KERNELS["sdpa"], mixed) is None
    assert kernel_problem(narrow, mixed) == "it implements the global and local patterns, not stepped"
    assert kernel_problem(narrow, ArchConfig(position="alibi")) == "it has no ALiBi bias (arch.position=alibi)"
    assert "attention dropout" in kernel_problem(narrow, ArchConfig(attention_dropout=0.1))
    narrow.serves = frozenset({"window", "stepped", "alibi", "dropout"})
    assert all(kernel_problem(narrow, a) is None for a in
               (mixed, ArchConfig(position="alibi"), ArchConfig(attention_dropout=0.1)))


# ---------------------------------------------------------------- what the objective writes into a model folder


def test_a_new_causal_objective_needs_no_name_in_the_model(tmp_path, monkeypatch):
    """An objective that says `causal` gets a causal model, and its saved config.json answers so without the
    objectives: the model folder never tests an objective's name (this one is new to it)."""
    monkeypatch.setitem(OBJECTIVES, "prefix-lm", OBJECTIVES["clm"])  # the clm objective under a new name
    config = built_config("prefix-lm")
    assert config.causal and config.objective == "prefix-lm"
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["causal"] is True
    assert CrammedConfig.from_pretrained(tmp_path).causal is True


def built_config(objective: str) -> CrammedConfig:
    arch = ArchConfig(objective=objective, hidden_size=32, num_heads=4, ffn_size=64, num_layers=2)
    runtime = SimpleNamespace(attention="sdpa", rotary="torch", loss="plain")
    return build_model(arch, 97, {"pad": 0, "cls": 2, "sep": 3, "mask": 4}, runtime).config


def test_the_config_built_for_an_objective_says_its_causal_trait():
    assert {n: built_config(n).causal for n in OBJECTIVES} == {n: OBJECTIVES.trait(n, "causal") for n in OBJECTIVES}


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

