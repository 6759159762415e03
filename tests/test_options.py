"""The remaining documented options, each exercised: precision, workers, logging, tensorboard, normaliser flags,
tokenizer from a Hugging Face folder, position/attention choices through the whole recipe."""

import json
import unicodedata
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from cramming.config import load_config
from cramming.data.tokenizer import train_tokenizer
from cramming.errors import UserError
from cramming.pretraining import pretrain
from cramming.train.resume import complete_checkpoints

CONF = Path(__file__).resolve().parents[1] / "conf"


def config_for(*overrides):
    base = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.batch_size=16", "train.max_steps=3",
            "train.validation_sequences=16", "data=sanity", "data.vocab_size=256", "data.seq_length=32",
            "data.max_chars=60000", "data.validation_fraction=0.1"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=base + list(overrides)))


@pytest.mark.parametrize("overrides", [
    ["impl.precision=bf16"],
    ["impl.precision=fp16"],
    ["impl.num_workers=1"],
    ["impl.loss=plain"],
    ["train.log_every=2", "train.schedule=budget-cosine"],
    ["train.optim.name=lion", "train.lr=1e-4", "train.schedule=budget-wsd", "train.cooldown=0.5"],
    ["train.optim.name=muon", "train.schedule=step-cosine", "train.warmup=0.3"],
    ["train.optim.name=sgd", "train.optim.momentum=0.8", "train.optim.nesterov=false", "train.lr=0.05",
     "train.schedule=budget-linear", "train.warmup=0"],
    ["train.schedule=step-wsd", "train.nonfinite=rollback", "train.rollback_lr_factor=0.25",
     "train.checkpoint_every_minutes=0.0001", "train.keep_checkpoints=1"],
    ["arch.position=learned", "impl.attention=eager", "arch.norm=rmsnorm"],
    ["arch.norm=scalenorm", "arch.qk_norm=true", "arch.init=megatron-scaled", "arch.init_std=0.03"],
    ["arch.init=small"],
    ["arch.position=rotary", "arch.rotary_pct=0.25", "arch.attention.pattern=[local]", "arch.attention.window=8",
     "arch.linear=btt"],
    ["arch.linear=monarch", "arch.linear_on=[ffn]", "arch.linear_args.blocks=4"],
    ["arch.linear=btt-moe", "arch.linear_args.experts=4", "arch.linear_args.experts_k=2", "arch.linear_args.cores=2"],
    ["arch.linear=lowrank", "arch.linear_args.rank=8", "arch.linear_on=[attention]"],
    ["arch.linear=kronecker"],
    # the "done when" command, at test size (the hybrid: gmlp blocks plus local attention)
    ["arch.num_layers=4", "arch.position=rotary", "arch.rotary_pct=0.25", "arch.layout=[gmlp,gmlp,gmlp,attention]",
     "arch.attention.pattern=[local]", "arch.attention.window=16", "arch.linear=btt"],
    ["arch.position=rpe", "arch.rpe_cache=false", "arch.rpe_buckets=16", "arch.rpe_max_distance=64",
     "arch.layout=[gmlp,attention]", "arch.gmlp_attn_dim=16", "arch.num_layers=2"],
    ["arch.position=rotary", "arch.rotary_every=2", "arch.num_layers=2", "arch.attention.pattern=[stepped,topk]",
     "arch.attention.window=8", "arch.attention.topk=4"],
    ["arch=gpt-tiny", "arch.num_layers=2", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128",
     "arch.position=alibi", "arch.attention.pattern=[local,stepped]", "arch.attention.window=8"],
    ["arch=gpt-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128"],
    ["arch.position=rotary", "arch.rotary_pct=0.5", "arch.rotary_interleaved=true", "arch.rotary_base=500",
     "impl.rotary=torch"],
    ["arch.position=alibi", "arch.attention.pattern=[local,global]", "arch.attention.window=4", "impl.attention=sdpa"],
    ["data.ordering=sentence-length", "data.tokenizer.kind=bpe"],
    ["arch=bert-base", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128"],
])
def test_recipe_runs_with(overrides, tmp_path):
    summary = pretrain(config_for(*overrides), tmp_path)
    assert summary["steps"] == 3 and summary["flops_per_token"] > 0
    if "train.keep_checkpoints=1" in overrides:  # saved every few milliseconds, only the newest kept
        kept = complete_checkpoints(tmp_path)
        assert len(kept) == 1 and kept[0].name != "step-00000000"
    assert (tmp_path / "checkpoint" / "model.safetensors").is_file()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged_steps = [r["step"] for r in records if "loss" in r]
    expected = [2] if "train.log_every=2" in overrides else [1, 2, 3]
    assert logged_steps == expected
    assert all(r["loss"] == r["loss"] for r in records if "loss" in r)  # finite, not NaN


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
