"""A component's own options live in its section (arch.rotary.pct, train.ema.decay, ...), whose rules count only
when the component is chosen; validation walks the schema rather than a hand-kept list; the old flat keys stop
with one line naming the new one, and what was saved before the move still loads and resumes."""

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from conftest import REPO
from omegaconf import OmegaConf
from test_cli_errors import compose_through_entry
from test_config import compose_config

from cramming.config import PretrainConfig
from cramming.errors import UserError
from cramming.model.arch import ArchConfig
from cramming.model.configuration_crammed import CrammedConfig
from cramming.model.modeling_crammed import CrammedForMaskedLM
from cramming.model.norms import NORMS
from cramming.renames import RENAMED, moved
from cramming.rules import registry_keys, schema_problems
from cramming.train.checkpointing import Checkpointer, find_resume
from cramming.train.nonfinite import NONFINITE
from cramming.train.state import TrainState
from cramming.validation import load_config


@pytest.mark.parametrize("old,new", sorted(RENAMED.items()))
def test_each_old_key_stops_with_one_line_naming_the_new_one(old, new, monkeypatch, capsys):
    line = compose_through_entry(monkeypatch, capsys, "pretrain", f"{old}=3")
    assert line == f"error: {old} was renamed: use {new}=3"


def test_an_old_key_in_a_config_file_or_in_eval_overrides_names_the_new_one(monkeypatch, capsys):
    """Not on the command line: a composed config holding it (a user's own YAML), and eval_after's overrides."""
    cfg = compose_config()
    OmegaConf.set_struct(cfg, False)  # as a config built by hand (the API), not by Hydra, which says it below
    with pytest.raises(UserError, match=r"^train.lawa_k was renamed: use train.lawa.k=<value>$"):
        load_config(OmegaConf.merge(cfg, {"train": {"lawa_k": 3}}))
    from cramming.sweep import eval_after_config

    with pytest.raises(UserError, match=r"^eval_overrides: arch.rpe_cache was renamed: use arch.rpe.cache=false$"):
        eval_after_config(SimpleNamespace(eval_after=True, eval_overrides=["arch.rpe_cache=false"]))
    line = compose_through_entry(monkeypatch, capsys, "eval", "+arch.rotary_pct=0.5")
    assert line == "error: arch.rotary_pct was renamed: use arch.rotary.pct=0.5"


@pytest.mark.parametrize("chosen,other,override", [
    ("arch.position=rpe", "arch.position=rotary", "arch.rpe.buckets=2"),
    ("arch.position=rotary", "arch.position=rpe", "arch.rotary.pct=1.5"),
    ("train.averaging=ema", "train.averaging=none", "train.ema.decay=1.5"),
    ("train.nonfinite=rollback", "train.nonfinite=skip", "train.rollback.lr_factor=2"),
    ("train.optim.name=muon", "train.optim.name=adamw", "train.optim.muon.lr=0"),
    ("arch.parametrization=mup", "arch.parametrization=standard", "arch.mup.base_width=0"),
])
def test_a_sections_rules_count_only_when_its_component_is_chosen(chosen, other, override):
    """An option of a component not chosen is read by nothing, so nothing refuses it (the issue's rule); the same
    value under the component that reads it stops with the one line naming it."""
    key, value = override.split("=")
    with pytest.raises(UserError, match=rf"^{key}={value}(\.0)? is invalid: must be"):
        load_config(compose_config(chosen, override))
    load_config(compose_config(other, override))


# What config.components() listed by hand before the walk, in its order: the walk must find every one.
HAND_KEPT = ["arch.ffn", "arch.activation", "arch.norm", "arch.init", "arch.linear", "arch.layout",
             "arch.attention.pattern", "arch.objective", "data.source", "arch.position", "train.schedule",
             "train.optim.name", "train.nonfinite", "train.averaging", "impl.attention", "impl.rotary", "impl.loss",
             "impl.distributed", "arch.parametrization", "train.masking"]


def test_the_walk_finds_every_option_naming_a_registry():
    assert sorted(key for key, _ in registry_keys(PretrainConfig)) == sorted(HAND_KEPT)


@dataclass
class Inner:
    COMPONENT: ClassVar[tuple] = ("kind", "halt")
    REGISTERED: ClassVar[dict] = {"norm": ()}
    norm: str = "layernorm"


@dataclass
class Outer:
    REGISTERED: ClassVar[dict] = {"kind": ()}
    kind: str = "skip"
    inner: Inner = field(default_factory=Inner)


NORMS.serves(Inner, "norm")  # as a component says which option names its entries
NONFINITE.serves(Outer, "kind")


def test_each_option_naming_components_is_served_where_its_entry_point_imports():
    """The schema marks an option (REGISTERED), the registry declares it serves it (Registry.serves), in modules
    that may not be imported yet: each entry point must import every one it walks, in a fresh process."""
    code = ("import importlib, sys; from cramming.rules import registry_keys, declared_registries; "
            "importlib.import_module(sys.argv[1]); ")
    walks = {"cramming.validation": "from cramming.config import PretrainConfig as S; "
                                    "print(len(list(registry_keys(S))))",
             "cramming.validation.eval": "from cramming.eval.config import EvalRunConfig as S; "
                                         "print(len(list(registry_keys(S))))",
             "cramming.checkpoints.model_folder": "from cramming.model.arch import ArchConfig as S; "
                                                  "print(len(list(declared_registries(S(), "
                                                  "leave_out=('objective',)))))"}
    counts = {}
    for module, walk in walks.items():
        result = subprocess.run([sys.executable, "-c", code + walk, module], capture_output=True, text=True,
                                timeout=300, cwd=REPO)
        assert result.returncode == 0, result.stderr[-2000:]
        counts[module] = int(result.stdout.split()[-1])
    import cramming.validation.eval  # noqa: F401  here, every registry serves: the fresh processes must match
    from cramming.eval.config import EvalRunConfig
    from cramming.rules import declared_registries

    assert counts == {"cramming.validation": len(HAND_KEPT),
                      "cramming.validation.eval": len(list(registry_keys(EvalRunConfig))),
                      "cramming.checkpoints.model_folder": len(list(registry_keys(ArchConfig))) - 1}
    assert counts["cramming.checkpoints.model_folder"] == len(list(declared_registries(ArchConfig()))) - 1


def test_an_option_nobody_serves_is_an_error_and_serves_needs_the_schemas_mark():
    @dataclass
    class Unserved:
        REGISTERED: ClassVar[dict] = {"norm": ()}
        norm: str = "layernorm"
        size: int = 1

    with pytest.raises(LookupError, match="Unserved.norm names registered components, but no imported registry"):
        list(schema_problems(Unserved()))
    with pytest.raises(KeyError, match="Unserved.size is not in Unserved.REGISTERED"):
        NORMS.serves(Unserved, "size")
    NORMS.serves(Unserved, "norm")
    assert next(filter(None, schema_problems(Unserved(norm="batchnorm")))).startswith("norm='batchnorm' is not")


def test_a_new_registry_field_is_checked_where_it_is_declared():
    """No list to extend: declaring the field's registry is what gets it checked, sections included (and only
    when the section's component is chosen)."""
    assert next(filter(None, schema_problems(Outer(kind="wavy"))), None).startswith("kind='wavy' is not a valid")
    Inner.COMPONENT = ("kind", "skip")
    try:
        problem = next(filter(None, schema_problems(Outer(inner=Inner(norm="batchnorm")))), None)
        assert problem.startswith("inner.norm='batchnorm' is not a valid option; choose one of: layernorm")
    finally:
        Inner.COMPONENT = ("kind", "halt")
    assert next(filter(None, schema_problems(Outer(inner=Inner(norm="batchnorm")))), None) is None


SMALL = dict(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, ffn_size=64, max_seq_length=32,
             layout=["attention", "gmlp"], attention_impl="eager")


def old_layout(config: dict) -> dict:
    """config.json as checkpoints wrote it before the move: the moved sections' fields flat (rotary_pct, ...)."""
    out = dict(config)
    for section in ("rotary", "rpe", "gmlp", "mup"):
        for name, value in out.pop(section).items():
            out[f"{section}_{name}"] = value
    return out


@pytest.mark.parametrize("arch", [
    dict(position="rotary", rotary=dict(pct=0.5, base=500.0, interleaved=True, every=2)),
    dict(position="rpe", rpe=dict(buckets=8, max_distance=16, cache=False), gmlp=dict(attn_dim=8)),
    dict(position="rotary", parametrization="mup", layout=["attention"], mup=dict(base_width=16)),
])
def test_a_checkpoint_written_before_loads_to_the_same_model(arch, tmp_path):
    torch.manual_seed(0)
    model = CrammedForMaskedLM(CrammedConfig(**{**SMALL, **arch})).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(old_layout(saved)))
    loaded = CrammedForMaskedLM.from_pretrained(tmp_path).eval()
    for section in ("rotary", "rpe", "gmlp", "mup"):
        assert getattr(loaded.config, section) == getattr(model.config, section)
    ids = torch.randint(5, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_every_moved_arch_option_maps_from_its_flat_name():
    """The model's config maps each old flat arch name by itself (section_field): the table and it agree."""
    for old, new in RENAMED.items():
        if old.startswith("arch."):
            assert new.split(".", 1)[1].replace(".", "_") == old.split(".", 1)[1]
            section, name = new.split(".")[1:]
            default = getattr(getattr(ArchConfig(), section), name)
            value = (not default) if isinstance(default, bool) else default + 1
            assert getattr(getattr(CrammedConfig(**{old.split(".", 1)[1]: value}), section), name) == value


def test_a_run_saved_before_the_move_still_resumes(tmp_path):
    config = load_config(compose_config("arch=crammed-bert-tiny", "train.averaging=lawa", "train.lawa.k=3",
                                        "train.optim.name=muon", "train.optim.muon.lr=0.01"))
    current = json.loads(json.dumps(dataclasses.asdict(config)))
    old = json.loads(json.dumps(current))
    old["train"]["lawa_k"] = old["train"].pop("lawa")["k"]
    old["train"]["lawa_every_fraction"] = 0.05
    old["train"]["optim"]["muon_lr"] = old["train"]["optim"].pop("muon")["lr"]
    old["train"]["optim"]["muon_momentum"] = 0.95
    old["arch"].update({f"rotary_{k}": v for k, v in old["arch"].pop("rotary").items()})
    assert moved(old) == current
    model = torch.nn.Linear(2, 2)
    Checkpointer(tmp_path / "run", None, 2, old).save(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                      torch.amp.GradScaler("cpu", enabled=False), TrainState(step=1))
    assert find_resume("auto", tmp_path / "run", config).name == "step-00000001"
    other = load_config(compose_config("arch=crammed-bert-tiny", "train.averaging=lawa", "train.lawa.k=4",
                                       "train.optim.name=muon", "train.optim.muon.lr=0.01"))
    assert find_resume("auto", tmp_path / "run", other) is None  # a moved value still counts
