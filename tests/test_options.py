"""The remaining documented options, each through the whole recipe and each observed doing what the docs say:
precision (the dtype the layers compute in), workers (worker processes), the loss path, logging, schedules (the
logged learning rates against their documented shapes), optimizers (the ones built), checkpoints kept, the
architecture choices (the modules of the model that trained), the tokenizer kind and the data ordering; plus
tensorboard, the normaliser flags, a Hugging Face tokenizer folder and compile."""

import json
import math
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

import cramming.data.loader as loader_module
from cramming import pretraining
from cramming import run as run_module
from cramming.checkpoints.step_folder import complete_checkpoints
from cramming.data.tokenizer import train_tokenizer
from cramming.errors import UserError
from cramming.model import CrammedForCausalLM
from cramming.model.attention import eager_attention, sdpa_attention
from cramming.model.gmlp import GMLPBlock
from cramming.model.linear import Dense
from cramming.model.modeling_crammed import MLP, TransformerBlock
from cramming.model.norms import LayerNorm, RMSNorm, ScaleNorm
from cramming.model.positions import LearnedPositions, NoPositions
from cramming.model.rotary import ROTARY_IMPLS
from cramming.model.structured_linear import BTT, BTTMoE, Kronecker, LowRank, Monarch
from cramming.pretraining import pretrain
from cramming.train.lion import Lion
from cramming.train.optim import Combined
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
LR, STEPS = 1e-3, 3  # train.lr of budget-o4, and the steps of every run here


def config_for(*overrides):
    base = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.batch_size=16", f"train.max_steps={STEPS}",
            "train.validation_sequences=16", "data=sanity", "data.vocab_size=256", "data.seq_length=32",
            "data.max_chars=60000", "data.validation_fraction=0.1"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=base + list(overrides)))


@dataclass
class Run:
    """What a run did, seen from inside: the model and optimizer it built, its data order, what the training
    forward computed, and what it logged."""

    run_dir: Path
    summary: dict = field(default_factory=dict)
    records: list = field(default_factory=list)
    model: nn.Module = None
    initial: dict = field(default_factory=dict)  # the weights as initialised, before the first step
    optimizer: torch.optim.Optimizer = None
    batches: object = None
    orders: list = field(default_factory=list)
    dtypes: set = field(default_factory=set)  # what layer 0's qkv projection computed in, while training
    logits: set = field(default_factory=set)  # whether the training forward returned logits

    @property
    def layers(self):
        return list(self.model.encoder.layers)

    def lrs(self) -> dict:
        return {r["step"]: r["lr"] for r in self.records if "loss" in r}


def run_recipe(overrides, run_dir: Path, monkeypatch) -> Run:
    run = Run(run_dir)

    def build_model(*args, **kwargs):
        model = real_build_model(*args, **kwargs)
        run.model, run.initial = model, {k: v.detach().clone() for k, v in model.state_dict().items()}
        first = model.encoder.layers[0]
        if isinstance(first, TransformerBlock):
            first.attn.qkv.register_forward_hook(lambda m, i, out: run.dtypes.add(out.dtype) if m.training else None)
        model.register_forward_hook(lambda m, i, out: run.logits.add(out.logits is not None) if m.training else None)
        return model

    def build_optimizer(*args, **kwargs):
        run.optimizer = real_build_optimizer(*args, **kwargs)
        return run.optimizer

    def train_batches(*args, **kwargs):
        run.batches = real_train_batches(*args, **kwargs)
        return run.batches

    class EndlessOrder(loader_module.EndlessOrder):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            run.orders.append(self)

    real_build_model, real_build_optimizer = run_module.build_model, run_module.build_optimizer
    real_train_batches = pretraining.train_batches
    monkeypatch.setattr(run_module, "build_model", build_model)
    monkeypatch.setattr(run_module, "build_optimizer", build_optimizer)
    monkeypatch.setattr(pretraining, "train_batches", train_batches)
    monkeypatch.setattr(loader_module, "EndlessOrder", EndlessOrder)
    run.summary = pretrain(config_for(*overrides), run_dir)
    run.records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run


# The documented schedule shapes, written out here (not imported): progress p before each step, warm-up w.
def warm(p, w):
    return max(p / w, 0.01)


def cosine(w):
    return lambda p: warm(p, w) if p < w else 0.5 * (1 + math.cos(math.pi * (p - w) / (1 - w)))


def linear(w):
    return lambda p: warm(p, w) if p < w else 1 - (p - w) / (1 - w)


def wsd(w, c):
    return lambda p: warm(p, w) if p < w else ((1 - p) / c if p > 1 - c else 1.0)


def follows(shape, lr=LR):
    """The logged lr of step s is lr * shape(progress), progress = (s - 1) / max_steps: with max_steps set and
    a day of budget, the step share is the budget fraction, and the schedule is read before each step."""
    def check(run):
        got = run.lrs()
        return bool(got) and all(v == pytest.approx(lr * shape((s - 1) / STEPS), rel=1e-3) for s, v in got.items())
    return check


def computes_in(dtype):
    return lambda run: run.dtypes == {dtype} and run.summary["precision"] == {
        torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


def norms_are(kind):
    def check(run):
        norms = [m for m in run.model.modules() if isinstance(m, (LayerNorm, RMSNorm, ScaleNorm))]
        return len(norms) >= 4 and all(type(m) is kind for m in norms)  # embedding, two per block, final
    return check


def initial_std(run, name):
    return run.initial[name].std().item()


def one_worker(run):
    return type(run.batches).__name__ == "_MultiProcessingDataLoaderIter" and run.batches._num_workers == 1


def sorted_by_periods(run):
    """Cramming's curriculum: one epoch of the order the run drew its sequences in, sorted by "." count."""
    folder = Path(run.summary["data"]["cache"])
    periods = np.load(folder / "train_periods.npy")
    order = run.orders[0]
    it = iter(order)
    epoch = [next(it) for _ in range(order.blocks)]
    return sorted(epoch) == list(range(order.blocks)) and (np.diff(periods[epoch]) >= 0).all() and periods.max() > 0


def tokenizer_model(run):
    return json.loads((run.run_dir / "checkpoint" / "tokenizer.json").read_text())["model"]["type"]


def attn(run, i=0):
    return run.layers[i].attn


CASES = {
    "fp32, fused loss (the CPU defaults)": ([], lambda r: computes_in(torch.float32)(r) and r.logits == {False}),
    "bf16": (["impl.precision=bf16"], computes_in(torch.bfloat16)),
    "fp16": (["impl.precision=fp16"], computes_in(torch.float16)),
    "a data worker": (["impl.num_workers=1"], one_worker),
    "plain loss": (["impl.loss=plain"], lambda r: r.logits == {True}),
    "log every 2, cosine": (["train.log_every=2", "train.schedule=budget-cosine"],
                            lambda r: list(r.lrs()) == [2] and follows(cosine(0.1))(r)),
    "lion, wsd": (["train.optim.name=lion", "train.lr=1e-4", "train.schedule=budget-wsd", "train.cooldown=0.5"],
                  lambda r: isinstance(r.optimizer, Lion) and follows(wsd(0.1, 0.5), lr=1e-4)(r)),
    "muon, step-cosine": (["train.optim.name=muon", "train.schedule=step-cosine", "train.warmup=0.3"],
                          lambda r: isinstance(r.optimizer, Combined)
                          and [type(p).__name__ for p in r.optimizer.parts] == ["Muon", "AdamW"]
                          and follows(cosine(0.3))(r)),
    "sgd, linear": (["train.optim.name=sgd", "train.optim.sgd.momentum=0.8", "train.optim.nesterov=false",
                     "train.lr=0.05", "train.schedule=budget-linear", "train.warmup=0"],
                    lambda r: type(r.optimizer) is torch.optim.SGD
                    and (r.optimizer.defaults["momentum"], r.optimizer.defaults["nesterov"]) == (0.8, False)
                    and follows(linear(0), lr=0.05)(r)),
    # a checkpoint after every step, however fast the step (6 microseconds between them)
    "step-wsd, rollback, keep 1": (["train.schedule=step-wsd", "train.nonfinite=rollback",
                                    "train.rollback.lr_factor=0.25", "train.checkpoint_every_minutes=1e-7",
                                    "train.keep_checkpoints=1"],
                                   lambda r: [c.name for c in complete_checkpoints(r.run_dir)] == ["step-00000003"]
                                   and follows(wsd(0.1, 0.2))(r)),
    "learned, eager, rmsnorm": (["arch.position=learned", "impl.attention=eager", "arch.norm=rmsnorm"],
                                lambda r: isinstance(r.model.encoder.positions, LearnedPositions)
                                and attn(r).kernel is eager_attention and norms_are(RMSNorm)(r)),
    "scalenorm, qk-norm, megatron init": (
        ["arch.norm=scalenorm", "arch.qk_norm=true", "arch.init=megatron-scaled", "arch.init_std=0.03"],
        lambda r: norms_are(ScaleNorm)(r) and isinstance(attn(r).q_norm, ScaleNorm)
        and initial_std(r, "encoder.layers.0.attn.qkv.weight") == pytest.approx(0.03, rel=0.05)
        and initial_std(r, "encoder.layers.0.attn.out.weight") == pytest.approx(0.03 / 2**0.5, rel=0.05)),
    "small init": (["arch.init=small"], lambda r: initial_std(r, "encoder.layers.0.ffn.up.weight")
                   == pytest.approx((2 / (5 * 64)) ** 0.5, rel=0.05)),
    "rotary, local, btt": (["arch.position=rotary", "arch.rotary.pct=0.25", "arch.attention.pattern=[local]",
                            "arch.attention.window=8", "arch.linear=btt"],
                           lambda r: attn(r).rotary.pct == 0.25 and attn(r).spec.window == 8
                           and isinstance(attn(r).qkv, BTT) and isinstance(r.layers[0].ffn.up, BTT)),
    "monarch on ffn": (["arch.linear=monarch", "arch.linear_on=[ffn]", "arch.linear_args.blocks=4"],
                       lambda r: isinstance(r.layers[0].ffn.up, Monarch) and r.layers[0].ffn.up.blocks == 4
                       and type(attn(r).qkv) is Dense),
    "btt-moe": (["arch.linear=btt-moe", "arch.linear_args.experts=4", "arch.linear_args.experts_k=2",
                 "arch.linear_args.cores=2"],
                lambda r: isinstance(attn(r).qkv, BTTMoE)
                and (attn(r).qkv.experts, attn(r).qkv.experts_k, attn(r).qkv.num_cores) == (4, 2, 2)),
    "lowrank on attention": (["arch.linear=lowrank", "arch.linear_args.rank=8", "arch.linear_on=[attention]"],
                             lambda r: isinstance(attn(r).qkv, LowRank) and attn(r).qkv.rank == 8
                             and type(r.layers[0].ffn.up) is Dense),
    "kronecker": (["arch.linear=kronecker"], lambda r: isinstance(attn(r).out, Kronecker)),
    # the "done when" command, at test size (the hybrid: gmlp blocks plus local attention)
    "hybrid": (["arch.num_layers=4", "arch.position=rotary", "arch.rotary.pct=0.25",
                "arch.layout=[gmlp,gmlp,gmlp,attention]", "arch.attention.pattern=[local]", "arch.attention.window=16",
                "arch.linear=btt"],
               lambda r: [type(m) for m in r.layers] == [GMLPBlock] * 3 + [TransformerBlock]
               and attn(r, 3).spec.window == 16 and attn(r, 3).rotary is not None
               and isinstance(r.layers[0].up, BTT)),
    "rpe, amlp": (["arch.position=rpe", "arch.rpe.cache=false", "arch.rpe.buckets=16", "arch.rpe.max_distance=64",
                   "arch.layout=[gmlp,attention]", "arch.gmlp.attn_dim=16", "arch.num_layers=2"],
                  lambda r: r.model.encoder.score_bias.embedding.weight.shape == (16, 2)
                  and r.model.encoder.score_bias.max_distance == 64 and r.model.config.rpe.cache is False
                  and r.layers[0].tiny_attention.dim == 16),
    "rotary every 2, stepped, topk": (["arch.position=rotary", "arch.rotary.every=2", "arch.num_layers=2",
                                       "arch.attention.pattern=[stepped,topk]", "arch.attention.window=8",
                                       "arch.attention.topk=4"],
                                      lambda r: [attn(r, i).rotary is not None for i in (0, 1)] == [True, False]
                                      and attn(r, 0).spec.stepped == 8
                                      and attn(r, 1).spec.topk == 4),
    "gpt, alibi, local + stepped": (["arch=gpt-tiny", "arch.num_layers=2", "arch.hidden_size=64", "arch.num_heads=2",
                                     "arch.ffn_size=128", "arch.position=alibi", "arch.attention.pattern=[local,stepped]",
                                     "arch.attention.window=8"],
                                    lambda r: isinstance(r.model, CrammedForCausalLM) and attn(r).spec.causal
                                    and attn(r).spec.alibi and attn(r, 0).spec.window == 8
                                    and attn(r, 1).spec.stepped == 8),
    "gpt": (["arch=gpt-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128"],
            lambda r: isinstance(r.model, CrammedForCausalLM) and attn(r).spec.causal and type(r.layers[0].ffn) is MLP),
    "rotary interleaved, base 500": (["arch.position=rotary", "arch.rotary.pct=0.5", "arch.rotary.interleaved=true",
                                      "arch.rotary.base=500", "impl.rotary=torch"],
                                     lambda r: (attn(r).rotary.pct, attn(r).rotary.interleaved, attn(r).rotary.base)
                                     == (0.5, True, 500) and attn(r).rotary.kernel is ROTARY_IMPLS["torch"]),
    "alibi, local + global, sdpa": (["arch.position=alibi", "arch.attention.pattern=[local,global]",
                                     "arch.attention.window=4", "impl.attention=sdpa", "arch.num_layers=2"],
                                    lambda r: attn(r).spec.alibi and isinstance(r.model.encoder.positions, NoPositions)
                                    and [attn(r, i).spec.window for i in (0, 1)] == [4, None]
                                    and attn(r).kernel is sdpa_attention),
    "sentence-length order, bpe": (["data.ordering=sentence-length", "data.tokenizer.kind=bpe"],
                                   lambda r: sorted_by_periods(r) and tokenizer_model(r) == "BPE"),
    "bert-base": (["arch=bert-base", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
                   "arch.ffn_size=128"],
                  lambda r: not r.layers[0].pre_norm and isinstance(r.model.encoder.positions, LearnedPositions)
                  and attn(r).qkv.bias is not None and type(r.layers[0].ffn) is MLP
                  and isinstance(r.model.transform, nn.Sequential) and isinstance(r.model.encoder.final_norm,
                                                                                 nn.Identity)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_recipe_runs_with(case, tmp_path, monkeypatch):
    overrides, observe = CASES[case]
    run = run_recipe(overrides, tmp_path, monkeypatch)
    assert run.summary["steps"] == STEPS and run.summary["flops_per_token"] > 0
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    logged = [r for r in run.records if "loss" in r]
    assert [r["step"] for r in logged] == ([2] if "train.log_every=2" in overrides else [1, 2, 3])
    assert all(math.isfinite(r["loss"]) for r in logged), logged
    assert math.isfinite(run.summary["val_loss"])
    assert observe(run), f"{case}: the option's effect is not there"


def test_tensorboard_option(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match=r"cramming\[tensorboard\]"):
            config_for("train.tensorboard=true")
        return
    pretrain(config_for("train.tensorboard=true"), tmp_path)
    assert any((tmp_path / "tensorboard").iterdir())


@pytest.mark.parametrize("flags,expected", [
    (dict(lowercase=True, strip_accents=True, ascii_only=True), "cafe naive"),
    (dict(lowercase=False, strip_accents=True, ascii_only=True), "Cafe Naive"),
    (dict(lowercase=True, strip_accents=False, ascii_only=False), unicodedata.normalize("NFD", "café naïve ☕")),
])
def test_normaliser_flags(flags, expected):
    tok = train_tokenizer(["Café naïve ☕ words and more words"] * 10, "wordpiece", 100, 32, **flags)
    assert tok.backend_tokenizer.normalizer.normalize_str("Café Naïve ☕").strip() == expected


def test_tokenizer_from_a_hugging_face_folder(tmp_path):
    tok = train_tokenizer(["some words to learn from, and a few more."] * 10, "wordpiece", 80, 32)
    tok.save_pretrained(tmp_path / "tok")
    config = config_for(f"data.tokenizer.kind={tmp_path / 'tok'}")
    summary = pretrain(config, tmp_path / "run")
    assert summary["data"]["vocab_size"] == len(tok)
    with pytest.raises(UserError, match="could not be loaded as a Hugging Face tokenizer"):
        pretrain(config_for(f"data.tokenizer.kind={tmp_path / 'missing'}"), tmp_path / "run2")


def test_compile_on_cpu(tmp_path):
    """impl.compile=true: torch.compile's work lands in the first step, reported as compile time."""
    summary = pretrain(config_for("impl.compile=true"), tmp_path)
    assert summary["steps"] == 3
    assert summary["wall_seconds"]["compile"] > summary["wall_seconds"]["train"]
