"""Traits, tested once. A registry declares the traits its entries may carry; an undeclared one is refused when
registering and when reading; traits are opt-in. Every consumer asks the trait, never a name: the table below flips
each declared trait of one entry and watches what its consumer decides change, and a trait no row flips fails the
completeness test, so a new trait comes with its row."""

import contextlib
import dataclasses
import inspect
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir

from cramming.checkpoints.step_folder import MARKER
from cramming.config import PretrainConfig, TrainConfig
from cramming.engines import ENGINES
from cramming.errors import UserError
from cramming.eval import finetune as finetune_module
from cramming.eval.config import EvalConfig, EvalRunConfig
from cramming.eval.finetune import HEADS, run_task
from cramming.eval.kinds import BENCHMARKS
from cramming.eval.recipe import card_entry, load_tasks
from cramming.eval.squad import fit_length
from cramming.impl import Runtime, resolve_kernels
from cramming.model import CrammedConfig, CrammedForMaskedLM
from cramming.model.arch import ArchConfig, AttentionConfig
from cramming.model.attention import ATTENTION_KERNELS, AttentionSpec, attend_at
from cramming.model.linear import LINEARS
from cramming.model.modeling_crammed import BLOCKS, FFNS, TransformerBlock, cache_problem
from cramming.model.parametrization import PARAMETRIZATIONS
from cramming.model.patterns import PATTERNS
from cramming.model.positions import POSITIONS, PositionScheme
from cramming.model.rotary import ROTARY_IMPLS
from cramming.pretraining import measure_untrained
from cramming.registry import Registry
from cramming.run import build_model, flops_per_token
from cramming.train.averaging import AVERAGING
from cramming.train.checkpointing import check_written_alike
from cramming.train.fp8 import torchao_problem
from cramming.train.masking import MASKINGS, mask_count
from cramming.train.nonfinite import NONFINITE
from cramming.train.objectives import OBJECTIVES, build_objective
from cramming.train.optim import OPTIMIZERS
from cramming.train.schedule import window_schedule_problem
from cramming.train.state import TrainState
from cramming.train.trainer import Budget, StepPlan, Trainer
from cramming.validation import load_config
from cramming.validation.across import (
    block_projections,
    engine_problem,
    masking_problem,
    token_dropping_problem,
    zero_init_problem,
)

CONF = Path(__file__).resolve().parents[1] / "conf"
SPECIAL = {"pad": 0, "cls": 2, "sep": 3, "mask": 4}
SMALL = {"hidden_size": 32, "num_heads": 4, "ffn_size": 64, "num_layers": 2, "max_seq_length": 16}
CPU = torch.device("cpu")


# ---------------------------------------------------------------- the registry's own rules


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


def test_a_new_entry_inherits_its_traits_and_lacks_those_nobody_gave_it(monkeypatch):
    """A block under a new name inherits the attention block's kv_cache; a position scheme that does not say its
    positions travel with the tokens is refused token dropping, and the message lists the schemes that do."""
    class Cached(TransformerBlock):
        """The attention block under another name: what it inherits says it takes a cache."""

    monkeypatch.setitem(BLOCKS, "cached", Cached)
    assert cache_problem(ArchConfig(layout=["attention", "cached"])) is None

    class Opaque(PositionScheme):
        """A scheme that does not say its positions travel with the tokens: opt-in, so refused."""

    monkeypatch.setitem(POSITIONS, "opaque", Opaque())
    assert token_dropping_problem(dropping(position="opaque")) == (
        "arch.token_dropping.keep=0.5 is invalid: needs positions that travel with the tokens "
        "(learned, none, rotary, scaled-sinusoidal, sinusoidal), not arch.position=opaque")


# ---------------------------------------------------------------- the probes: what a consumer decides


def message(call):
    """A check's refusal as its text (returned, or raised as a UserError or ValueError), None when it accepts."""
    try:
        return call()
    except (UserError, ValueError) as err:
        return str(err)


def refused(*overrides):
    """The refusal of the composed pretraining config arch=gpt-tiny + overrides, through the validation layer."""
    def load():
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            load_config(compose(config_name="pretrain", overrides=["arch=gpt-tiny", *overrides]))
    return message(load)


def run_config(**values) -> PretrainConfig:
    """PretrainConfig() with dotted keys set: run_config(**{"arch.objective": "clm"})."""
    config = PretrainConfig()
    for key, value in values.items():
        *path, last = key.split(".")
        section = config
        for name in path:
            section = getattr(section, name)
        setattr(section, last, value)
    return config


def dropping(**arch) -> PretrainConfig:
    return run_config(**{"arch.token_dropping.keep": 0.5, **{f"arch.{k}": v for k, v in arch.items()}})


def built_config(objective: str):
    arch = ArchConfig(objective=objective, **SMALL)
    runtime = SimpleNamespace(attention="sdpa", rotary="torch", loss="plain")
    return build_model(arch, 97, SPECIAL, runtime).config


def model_flops():
    config = run_config(**{"arch.objective": "mlm", "arch.sparse_prediction": True})
    for key, value in SMALL.items():
        setattr(config.arch, key, value)
    model = build_model(config.arch, 97, SPECIAL, Runtime(CPU, "fp32", False, "sdpa", "torch"))
    return flops_per_token(model, config)


def stepped_attention():
    """Stepped attention computed at positions that are not the tensor's indices (a dropped-token subset)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    ids = torch.tensor([0, 2, 5, 7])
    spec = AttentionSpec(stepped=2, scale=8 ** -0.5)
    return attend_at(q, k, v, spec, PATTERNS["stepped"], SimpleNamespace(ids=ids, key_ids=ids)).flatten().tolist()


def mlm_objective(masking: str):
    """An mlm objective built without a tokenizer: a masking that reads words refuses."""
    meta = {"special_ids": SPECIAL, "vocab_size": 97}
    return message(lambda: build_objective("mlm", TrainConfig(masking=masking), meta, CPU) and "built")


def checkpoints_before_the_first_step(policy: str) -> bool:
    saved = []
    measure_untrained(run_config(**{"train.nonfinite": policy}), TrainState(), lambda: {"val_loss": 1.0},
                      lambda: saved.append(True), lambda *a, **k: None)
    return bool(saved)


def resumed_on_another_world(tmp_path) -> str | None:
    (tmp_path / MARKER).write_text(json.dumps({"world": 2}))
    return message(lambda: check_written_alike(tmp_path, ENGINES["ddp"](world=4)))


def kernel_choice(attention: str, rotary: str):
    """resolve_kernels on a CPU without the Triton interpreter."""
    return message(lambda: resolve_kernels(attention, rotary, ArchConfig(), CPU))


def squad_fit(position: str, layout=("attention",)):
    config = SimpleNamespace(max_seq_length=128, position=position, layout=list(layout))
    return message(lambda: fit_length(config, 384)) or config.max_seq_length


def glue_loaded(tmp_path):
    """Two GLUE tasks whose folders are missing, with eval.skip_missing: skipped (and none left), or an error."""
    e = EvalConfig(kind="glue", tasks=["rte", "sst2"], data_dir=str(tmp_path), skip_missing=True)
    return message(lambda: load_tasks(EvalRunConfig(eval=e)))


def card_comparable():
    config = SimpleNamespace(eval=SimpleNamespace(kind="glue", seeds=1))
    results = {"models": {"pretrained": {"tasks": {}}}, "comparable": True, "finished_at": "now"}
    return card_entry(config, results, {})["comparable"]


def scores_as_it_is(checkpoint, tokenizer, task, recipe, seed, runtime, random_init):
    return "scored"


scores_as_it_is.untrained = True


def scored_or_finetuned(monkeypatch):
    """How run_task runs a head: called as it is (untrained), or through the fine-tuning loop."""
    monkeypatch.setattr(finetune_module, "finetune", lambda head, *args, **kwargs: "fine-tuned")
    task = SimpleNamespace(head="scores-as-it-is")
    result = run_task("ckpt", None, task, None, 0, None, False, "label")
    return result["final"] if isinstance(result, dict) else result


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))

    def forward(self, ids):
        return SimpleNamespace(loss=self.weight * ids.float().mean())


def rows_in_a_step_past_the_budget() -> int:
    """A step of three microbatches begun with the budget spent: one process takes the one microbatch it has seen;
    an engine whose ranks agree once per step takes the whole step."""
    parts = SimpleNamespace(engine=ENGINES["none"](), model=Scale(), scaler=torch.amp.GradScaler("cpu", enabled=False),
                            batches=iter(lambda: torch.ones(2, 4, dtype=torch.long), None),
                            objective=SimpleNamespace(batch=lambda ids, mask: {"ids": ids}),
                            masks=SimpleNamespace(at=lambda position: None))
    trainer = Trainer(parts=parts, cfg=TrainConfig(), budget=Budget(seconds=0.0), microbatch=2, seq_length=4,
                      device=CPU, autocast=contextlib.nullcontext)
    trainer.start = time.perf_counter()
    return trainer.accumulate(TrainState(), StepPlan(batch_size=6, accumulation=3, rows_per_sequence=1, lr=1.0))[2]


def describe_two_ranks(name: str) -> str:
    return ENGINES[name](world=2).describe()


def averaging_problem(engine: str):
    averaging = next(entry for entry in AVERAGING.values() if entry is not None)
    return averaging.problem(run_config(**{"impl.distributed": engine}))


MUP = "arch.parametrization=mup"
LONG = ["arch.position=rotary", "arch.max_seq_length=128", "data.seq_length=64",
        "train.seq_schedule=[[0.5,64],[0.5,256]]"]
ALIBI = {**SMALL, "vocab_size": 97, "attention_impl": "eager", "position": "alibi"}
LOCAL = AttentionConfig(pattern=["local"])


def zero_init_lowrank():
    return zero_init_problem(run_config(**{"arch.zero_init_out": True, "arch.linear": "lowrank",
                                           "arch.linear_on": ["ffn"]}))


def window_schedule_on_local():
    return window_schedule_problem(run_config(**{"arch.attention": LOCAL,
                                                 "train.window_schedule": [[0.5, 16], [0.5, 32]]}))


def deepspeed_halting():
    config = run_config(**{"impl.deepspeed.zero_stage": 0, "train.nonfinite": "halt"})
    return engine_problem(config, ENGINES["deepspeed"](), SimpleNamespace(precision="bf16"))


@dataclass
class Flip:
    """Flip `trait` of `registry[entry]`: what `probe` returns changes from `before` to `after` (a regex the value's
    text must match, None, or the value itself; both None: only that it changes)."""

    registry: Registry
    entry: str
    trait: str
    probe: object  # () -> value, or it takes monkeypatch and/or tmp_path
    before: object
    after: object
    needs: str | None = None  # an optional dependency the consumer checks first (skipped without it)
    entries: dict | None = None  # entries the row adds to the registry first


FLIPS = {
    "optimizer-normalised-grant": Flip(
        OPTIMIZERS, "sgd", "normalised_updates", lambda: refused(MUP, "train.optim.name=sgd"),
        "use one of adamw, lion or arch.parametrization=standard", None),
    "optimizer-normalised-revoke": Flip(
        OPTIMIZERS, "lion", "normalised_updates", lambda: refused(MUP, "train.optim.name=lion"),
        None, "train.optim.name='lion' is invalid: .* use one of adamw or"),
    "mup-needs-normalised": Flip(
        PARAMETRIZATIONS, "mup", "needs_normalised_updates", lambda: refused(MUP, "train.optim.name=sgd"),
        "use one of adamw, lion", None),
    "mup-width-relative": Flip(
        PARAMETRIZATIONS, "mup", "width_relative",
        lambda: OBJECTIVES["rtd"].problem(run_config(**{"arch.parametrization": "mup"})),
        "trains a generator of another width, .* use standard", None),
    "block-width-scaled": Flip(
        BLOCKS, "gmlp", "width_scaled", lambda: refused(MUP, "arch.layout=[attention,gmlp]"),
        "does not scale gmlp blocks .* use only attention blocks", None),
    "block-value-embedding": Flip(
        BLOCKS, "gmlp", "takes_value_embedding",
        lambda: refused("arch.value_embeddings=1", "arch.layout=[gmlp,attention]"),
        "use only attention blocks in arch.layout", None),
    "block-fixed-length": Flip(
        BLOCKS, "attention", "fixed_length", lambda: refused(*LONG),
        None, "rotary positions and attention do not extrapolate"),
    "block-fixed-length-squad": Flip(
        BLOCKS, "gmlp", "fixed_length", lambda: squad_fit("rotary", ["gmlp"]),
        "longer than this checkpoint's gmlp blocks' sequence-sized weights", 384),
    "block-kv-cache": Flip(
        BLOCKS, "attention", "kv_cache", lambda: cache_problem(ArchConfig(layout=["attention"])),
        None, "no KV cache for arch.layout=\\['attention'\\]: attention blocks keep no keys"),
    "block-token-subsets": Flip(
        BLOCKS, "gmlp", "token_subsets",
        lambda: token_dropping_problem(dropping(position="rotary", layout=["attention", "gmlp"])),
        "use only attention blocks in arch.layout", None),
    "position-token-subsets": Flip(
        POSITIONS, "rotary", "token_subsets", lambda: token_dropping_problem(dropping(position="rotary")),
        None, r"\(learned, none, scaled-sinusoidal, sinusoidal\), not arch.position=rotary"),
    "position-alibi": Flip(
        POSITIONS, "alibi", "alibi",
        lambda: CrammedForMaskedLM(CrammedConfig(**ALIBI)).encoder.layers[0].attn.spec.alibi, True, False),
    "position-learned-table": Flip(
        POSITIONS, "learned", "learned_table", lambda: squad_fit("learned"),
        "longer than this checkpoint's learned position table", 384),
    "pattern-token-subsets": Flip(
        PATTERNS, "local", "token_subsets",
        lambda: token_dropping_problem(dropping(position="rotary", attention=LOCAL)), "use global or topk", None),
    "pattern-windowed": Flip(
        PATTERNS, "local", "windowed", window_schedule_on_local,
        None, "needs a stepped pattern in arch.attention.pattern"),
    "pattern-absolute": Flip(PATTERNS, "stepped", "absolute", stepped_attention, None, None),
    "linear-structured": Flip(LINEARS, "lowrank", "structured", zero_init_lowrank, "use arch.linear=dense", None),
    "ffn-gated": Flip(
        FFNS, "mlp", "gated", lambda: block_projections(ArchConfig(ffn="mlp", hidden_size=32, ffn_size=64))["ffn"],
        [(32, 64), (64, 32)], [(32, 64), (32, 32)]),
    "objective-masks-tokens": Flip(
        OBJECTIVES, "clm", "masks_tokens",
        lambda: masking_problem(run_config(**{"arch.objective": "clm", "train.masking": "whole-word"})),
        r"\(or choose arch.objective=mlm or rtd\)", None),
    "objective-causal": Flip(
        OBJECTIVES, "clm", "causal", lambda: message(lambda: built_config("clm").causal),
        True, "objective 'clm', whose attention is bidirectional"),
    "objective-scores-masked-only": Flip(OBJECTIVES, "mlm", "scores_masked_only", model_flops, None, None),
    "masking-grouped": Flip(
        MASKINGS, "span", "grouped",
        lambda: masking_problem(run_config(**{"arch.objective": "clm", "train.masking": "span"})),
        "arch.objective=clm masks nothing", None),
    "masking-reads-words": Flip(
        MASKINGS, "token", "reads_words", lambda: mlm_objective("token"),
        "built", "needs the tokenizer to find word starts"),
    "masking-per-span": Flip(MASKINGS, "token", "per_span", lambda: mask_count(0.15, 128, "token"), 19, 20),
    "nonfinite-continues": Flip(NONFINITE, "halt", "continues", deepspeed_halting, None, "or train.nonfinite=rollback"),
    "nonfinite-checkpoint-first": Flip(
        NONFINITE, "halt", "checkpoint_first", lambda: checkpoints_before_the_first_step("halt"), False, True),
    "engine-shards-weights": Flip(
        ENGINES, "ddp", "shards_weights", lambda: averaging_problem("fsdp2"),
        "use impl.distributed=ddp or none, or", "use impl.distributed=none, or"),
    "engine-same-world": Flip(
        ENGINES, "ddp", "same_world_to_resume", resumed_on_another_world, None, "resume it on 2 processes, not 4"),
    "engine-whole-steps": Flip(ENGINES, "none", "whole_steps", rows_in_a_step_past_the_budget, 2, 6),
    "engine-active": Flip(ENGINES, "none", "active", lambda: describe_two_ranks("none"), "", ", none on 2 processes"),
    "attention-needs-triton": Flip(
        ATTENTION_KERNELS, "sdpa", "needs_triton", lambda: kernel_choice("sdpa", "torch"),
        ("sdpa", "torch"), "impl.attention=sdpa cannot serve this run: Triton kernels"),
    "rotary-needs-triton": Flip(
        ROTARY_IMPLS, "torch", "needs_triton", lambda: kernel_choice("sdpa", "torch"),
        ("sdpa", "torch"), "impl.rotary=torch cannot serve this run: Triton kernels"),
    "benchmark-skippable": Flip(
        BENCHMARKS, "glue", "skippable", glue_loaded,
        r"no task could be loaded \(rte, sst2\)", "rte: missing task folder"),
    "benchmark-published": Flip(BENCHMARKS, "glue", "published", card_comparable, True, False),
    "head-untrained": Flip(
        HEADS, "scores-as-it-is", "untrained", scored_or_finetuned, "scored", "fine-tuned",
        entries={"scores-as-it-is": scores_as_it_is}),
}


def agrees(value, expected) -> bool:
    if isinstance(expected, str):
        return isinstance(value, str) and re.search(expected, value) is not None
    return value == expected


@pytest.mark.parametrize("name", list(FLIPS))
def test_flipping_a_trait_flips_what_its_consumer_decides(name, monkeypatch, tmp_path):
    flip = FLIPS[name]
    if flip.needs == "torchao" and torchao_problem():
        pytest.skip("the consumer checks torchao first (pip install -e '.[fp8]')")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the kernel rows ask a CPU without the interpreter
    for key, entry in (flip.entries or {}).items():
        monkeypatch.setitem(flip.registry, key, entry)

    def probe():
        fixtures = {"monkeypatch": monkeypatch, "tmp_path": tmp_path}
        return flip.probe(*[fixtures[name] for name in inspect.signature(flip.probe).parameters])

    before = probe()
    if flip.before is not None or flip.after is not None:
        assert agrees(before, flip.before), f"{name}: before the flip {before!r}, expected {flip.before!r}"
    entry, had = flip.registry[flip.entry], flip.registry.trait(flip.entry, flip.trait)
    if dataclasses.is_dataclass(entry) and entry.__dataclass_params__.frozen:  # a Benchmark: a new entry, flipped
        monkeypatch.setitem(flip.registry, flip.entry, dataclasses.replace(entry, **{flip.trait: not had}))
    else:
        monkeypatch.setattr(entry, flip.trait, not had, raising=False)
    after = probe()
    assert after != before, f"{name}: flipping {flip.trait} of {flip.entry} changed nothing ({after!r})"
    if flip.before is not None or flip.after is not None:
        assert agrees(after, flip.after), f"{name}: after the flip {after!r}, expected {flip.after!r}"


def test_every_declared_trait_has_a_row():
    """A trait is a decision some component makes from it: each registry's declared traits are all flipped above."""
    registries = [PARAMETRIZATIONS, PATTERNS, BLOCKS, LINEARS, ATTENTION_KERNELS, FFNS, ROTARY_IMPLS, POSITIONS,
                  ENGINES, OPTIMIZERS, NONFINITE, OBJECTIVES, MASKINGS, BENCHMARKS, HEADS]
    flipped = {(flip.registry.kind, flip.trait) for flip in FLIPS.values()}
    declared = {(registry.kind, trait) for registry in registries for trait in registry.traits}
    assert declared - flipped == set()
