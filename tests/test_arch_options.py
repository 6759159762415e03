"""Every arch key, from the Hydra config to the built model: each one reaches the model's config, and each one the
docs document changes the model the documented way (built in-process, no training). test_options.py observes
the same options in whole runs; test_model.py holds the finer model tests."""

import dataclasses
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn
from torch.nn import functional as F

from cramming import impl as impl_
from cramming.config import ArchConfig
from cramming.data.tokenizer import SPECIAL_IDS
from cramming.model.positions import NoPositions, ScaledSinusoidalPositions, SinusoidalPositions, sinusoid_table
from cramming.run import build_model
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
BASE = ["arch=crammed-bert-tiny", "arch.num_layers=2", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "data=sanity", "data.vocab_size=256", "data.seq_length=32"]
VOCAB = 256


def model_for(*overrides, seed=0):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        config = load_config(compose(config_name="pretrain", overrides=BASE + list(overrides)))
    torch.manual_seed(seed)
    return build_model(config.arch, VOCAB, SPECIAL_IDS, impl_.resolve(config.impl, config.arch)).eval()


def ids(batch=2, seq=32, seed=0):
    return torch.randint(5, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def logits(model, x=None):
    with torch.no_grad():
        return model(ids() if x is None else x).logits


# A value unlike the default for every key (with the companions that value needs), and the name the model's
# config gives the key. A new arch key fails the first test until it is listed here.
NONDEFAULT = {
    "num_layers": (3, []), "hidden_size": (32, []), "num_heads": (4, []), "ffn_size": (64, []),
    "ffn": ("mlp", []), "activation": ("relu2", []), "norm": ("rmsnorm", []), "norm_eps": (1e-6, []),
    "norm_position": ("post", []), "first_attention_norm": (False, []), "qk_norm": (True, []), "embedding_norm": (False, []), "final_norm": (False, []),
    "bias": (True, []), "position": ("rotary", []), "rotary.pct": (0.5, ["arch.position=rotary"]),
    "rotary.base": (500.0, ["arch.position=rotary"]), "rotary.interleaved": (True, ["arch.position=rotary"]),
    "rotary.every": (2, ["arch.position=rotary"]), "rpe.buckets": (16, ["arch.position=rpe"]),
    "rpe.max_distance": (64, ["arch.position=rpe"]), "rpe.cache": (False, ["arch.position=rpe"]),
    "layout": (["gmlp", "attention"], []), "gmlp.attn_dim": (8, ["arch.layout=[gmlp]"]),
    "attention.pattern": (["local", "global"], ["arch.attention.window=8"]), "attention.window": (8, []),
    "attention.topk": (4, ["arch.attention.pattern=[topk]", "impl.attention=eager"]),
    "linear": ("lowrank", []), "linear_on": (["ffn"], []),
    "linear_args.rank": (4, ["arch.linear=lowrank"]), "linear_args.blocks": (2, ["arch.linear=monarch"]),
    "linear_args.cores": (2, ["arch.linear=btt"]), "linear_args.experts": (2, ["arch.linear=btt-moe"]),
    "linear_args.experts_k": (1, ["arch.linear=btt-moe"]), "max_seq_length": (64, []),
    "tie_embeddings": (False, []), "objective": ("clm", []), "head_transform": (True, []),
    "sparse_prediction": (False, []), "init": ("small", []), "init_std": (0.05, []), "hidden_dropout": (0.2, []),
    "attention_dropout": (0.3, []),
    "logit_softcap": (15.0, []), "zero_init_out": (True, []), "value_embeddings": (1, []), "unet_skips": (True, []),
    "parametrization": ("mup", []), "mup.base_width": (32, []),
    "rtd.generator_scale": (0.5, ["arch.objective=rtd"]), "rtd.generator_layers": (1, ["arch.objective=rtd"]),
    "rtd.weight": (10.0, ["arch.objective=rtd"]), "rtd.tie_embeddings": (False, ["arch.objective=rtd"]),
    "token_dropping.keep": (0.5, ["arch.num_layers=3"]), "token_dropping.decay": (0.9, []),
    "token_dropping.cross_first": (False, []),
    "token_dropping.layers": ([1, 3], ["arch.num_layers=4", "arch.token_dropping.keep=0.5"]),
}


def arch_keys(cls=ArchConfig, prefix=""):
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            yield from arch_keys(f.default_factory, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def in_model_config(model, key):
    value = model.config
    for part in key.split("."):  # the model's config has the run config's shape: attention.window
        value = getattr(value, part)
    return value


def test_every_arch_key_is_listed():
    assert sorted(arch_keys()) == sorted(NONDEFAULT)


@pytest.mark.parametrize("key", sorted(NONDEFAULT))
def test_every_arch_key_reaches_the_model(key):
    value, companions = NONDEFAULT[key]
    text = f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value).lower()
    default = ArchConfig()
    for part in key.split("."):
        default = getattr(default, part)
    assert default != value
    assert in_model_config(model_for(*companions, f"arch.{key}={text}"), key) == value


@pytest.mark.parametrize("name,fn", [("gelu", F.gelu), ("relu", F.relu), ("silu", F.silu),
                                     ("relu2", lambda x: F.relu(x) ** 2)])
def test_activation_is_the_named_function(name, fn):
    x = torch.linspace(-3, 3, 13)
    for kind in ("glu", "mlp"):
        act = model_for(f"arch.activation={name}", f"arch.ffn={kind}").encoder.layers[0].ffn.act
        torch.testing.assert_close(act(x), fn(x))


def test_mlp_keeps_the_full_width_and_glu_halves_it():
    mlp, glu = model_for("arch.ffn=mlp").encoder.layers[0].ffn, model_for("arch.ffn=glu").encoder.layers[0].ffn
    assert mlp.up.weight.shape == (128, 64) and mlp.down.weight.shape == (64, 128)
    assert glu.up.weight.shape == (128, 64) and glu.down.weight.shape == (64, 64)


def test_post_norm_normalises_the_residual_stream_and_pre_norm_does_not():
    """norm_position=post: each block ends with a norm, so its output has zero mean and unit variance per token."""
    x = torch.randn(2, 32, 64) * 3 + 1
    for position, normalised in (("post", True), ("pre", False)):
        block = model_for(f"arch.norm_position={position}").encoder.layers[0]
        with torch.no_grad():
            y = block(x)
        unit = torch.allclose(y.mean(-1), torch.zeros(2, 32), atol=1e-4) and torch.allclose(
            y.var(-1, unbiased=False), torch.ones(2, 32), atol=1e-3)
        assert unit == normalised, position


def test_first_attention_norm_false_leaves_out_the_first_blocks_attention_norm_only():
    """ModernBERT's first block reads the normalised embeddings as they are: its attention input is x itself."""
    model = model_for("arch.first_attention_norm=false", "arch.num_layers=3")
    first, later = model.encoder.layers[0], model.encoder.layers[1:]
    assert isinstance(first.norm1, nn.Identity) and not isinstance(first.norm2, nn.Identity)
    assert all(not isinstance(layer.norm1, nn.Identity) for layer in later)
    x = torch.randn(2, 32, 64) * 3 + 1
    with torch.no_grad():
        y = x + first.attn(x)  # no norm before the attention
        torch.testing.assert_close(first(x), y + first.ffn(first.norm2(y)))


def test_first_attention_norm_false_is_refused_with_post_norm():
    from cramming.errors import UserError

    with pytest.raises(UserError, match="arch.first_attention_norm"):
        model_for("arch.first_attention_norm=false", "arch.norm_position=post")


def test_max_seq_length_sizes_the_learned_table_and_the_gmlp_matrix():
    assert model_for("arch.position=learned", "arch.max_seq_length=48").encoder.positions.embedding.weight.shape == (
        48, 64)
    assert model_for("arch.layout=[gmlp]", "arch.max_seq_length=40").encoder.layers[0].spatial.shape == (40, 40)


def parameters(model):
    return sum(p.numel() for p in model.parameters())


def test_untied_embeddings_add_a_decoder_matrix():
    tied, untied = model_for(), model_for("arch.tie_embeddings=false")
    assert tied.decoder.weight is tied.encoder.tokens.weight
    assert untied.decoder.weight is not untied.encoder.tokens.weight
    assert parameters(untied) == parameters(tied) + VOCAB * 64


@pytest.mark.parametrize("key", ["embedding_norm", "final_norm"])
def test_embedding_and_final_norm_can_be_dropped(key):
    with_norm, without = model_for(), model_for(f"arch.{key}=false")
    assert isinstance(getattr(without.encoder, key), nn.Identity)
    assert parameters(with_norm) == parameters(without) + 64  # a LayerNorm's weight (no bias by default)
    assert not torch.allclose(logits(with_norm), logits(without))


@pytest.mark.parametrize("key", ["hidden_dropout", "attention_dropout"])
def test_dropout_acts_in_training_only(key):
    """Each dropout alone makes two training forwards differ; eval mode and a rate of 0 are deterministic."""
    other = "attention_dropout" if key == "hidden_dropout" else "hidden_dropout"
    model = model_for(f"arch.{key}=0.5", f"arch.{other}=0")
    x = ids()
    model.train()
    assert not torch.allclose(model(x).logits, model(x).logits)
    model.eval()
    torch.testing.assert_close(model(x).logits, model(x).logits)
    off = model_for(f"arch.{key}=0", f"arch.{other}=0").train()
    torch.testing.assert_close(off(x).logits, off(x).logits)


def test_sinusoidal_positions_are_the_fixed_table_and_scaled_ones_learn_a_scale():
    plain = model_for("arch.position=sinusoidal").encoder.positions
    scaled = model_for("arch.position=scaled-sinusoidal").encoder.positions
    assert type(plain) is SinusoidalPositions and isinstance(scaled, ScaledSinusoidalPositions)
    torch.testing.assert_close(plain(32), sinusoid_table(128, 64)[:32])
    torch.testing.assert_close(scaled(32), sinusoid_table(128, 64)[:32] / 8.0)  # scale starts at 1/sqrt(64)
    assert [n for n, _ in scaled.named_parameters()] == ["scale"] and not list(plain.parameters())


def test_no_positions_make_a_bidirectional_model_permutation_equivariant():
    model = model_for("arch.position=none")
    assert isinstance(model.encoder.positions, NoPositions)
    x, perm = ids(batch=1), torch.randperm(32, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(model, x)[:, perm], logits(model, x[:, perm]), atol=1e-5, rtol=1e-5)
    learned = model_for("arch.position=learned")
    assert not torch.allclose(logits(learned, x)[:, perm], logits(learned, x[:, perm]), atol=1e-3)


@pytest.mark.parametrize("override", ["arch.rotary.pct=0.25", "arch.rotary.base=500", "arch.rotary.interleaved=true"])
def test_each_rotary_setting_changes_the_function(override):
    """Same weights, one rotary setting changed: different outputs (what each computes: test_rotary_kernel.py)."""
    base = model_for("arch.position=rotary", "arch.init_std=0.3")
    changed = model_for("arch.position=rotary", "arch.init_std=0.3", override)
    changed.load_state_dict(base.state_dict())
    assert (logits(base) - logits(changed)).abs().max() > 1e-3
