"""What a family of transformers' architectures declares (families/__init__.py), and helpers its tensor map uses."""

from dataclasses import dataclass

import torch

TOLERANCE = 1e-5  # fp32 logits, in-library model against ours, at every real (unpadded) position

# Our activations by their name in transformers' ACT2FN (F.gelu is the exact erf GELU, ACT2FN's "gelu").
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "silu": "silu", "relu2": "relu2"}


@dataclass(frozen=True)
class Rule:
    """One option the family needs: `option` a dotted arch name (rotary.pct), `holds(value, config)` whether its
    value is representable, `needs` what the message says it needs."""

    option: str
    holds: object
    needs: str

    def value(self, config):
        value = config
        for part in self.option.split("."):
            value = getattr(value, part)
        return value


def rules(**wanted) -> list[Rule]:
    """Rules from option=value (the value it must have) or option=(predicate, what it needs)."""
    out = []
    for option, want in wanted.items():
        option = option.replace("__", ".")
        if isinstance(want, tuple) and callable(want[0]):
            out.append(Rule(option, want[0], want[1]))
        else:
            out.append(Rule(option, lambda value, config, want=want: value == want, f"{want!r}"))
    return out


# What every family needs: the plain transformer stack, read as ours reads it at inference.
COMMON = rules(
    layout=(lambda value, config: set(value) == {"attention"}, "attention blocks only (['attention'])"),
    linear=(lambda value, config: value == "dense" or not config.linear_on, "dense projections ('dense')"),
    value_embeddings=0, unet_skips=False, parametrization="standard", logit_softcap=None, qk_norm=False,
    activation=(lambda value, config: value in ACTIVATIONS, f"one of {sorted(ACTIVATIONS)}"),
    norm=(lambda value, config: value in ("layernorm", "rmsnorm"), "layernorm or rmsnorm"),
)


class Family:
    """What a family declares; the methods below are what the export asks."""

    name: str  # --as <name>
    model_class: str  # transformers' class the folder loads as
    causal: bool  # a causal LM family (else a masked LM)
    presets: tuple[str, str]  # the arch presets that train a model of this family (conf/arch/): GPU, CPU size
    rules: list[Rule]

    def misfit(self, config) -> str | None:
        """The first of our options this family cannot represent, in one line with the preset that can; None when
        the checkpoint is exactly representable."""
        train = (f"arch={self.presets[0]} (arch={self.presets[1]} on a CPU) trains a model that exports to "
                 f"{self.name}")
        objective = "clm" if self.causal else "mlm"
        if config.objective != objective:
            return f"arch.objective={config.objective!r} has no counterpart in {self.model_class} (it needs " \
                   f"{objective!r}); {train}"
        for rule in [*COMMON, *self.rules]:
            value = rule.value(config)
            if not rule.holds(value, config):
                return (f"arch.{rule.option}={value!r} has no counterpart in {self.model_class} (it needs "
                        f"{rule.needs}); {train}")
        return None

    def config(self, config, special: dict):
        """transformers' config of the exported model. special: the tokenizer's ids (pad, bos, eos, cls, sep,
        mask; None where it has none)."""
        raise NotImplementedError

    def tensors(self, state: dict, config) -> dict:
        """The exported model's tensors from ours (`state`: the head's state dict)."""
        raise NotImplementedError


def split_qkv(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our fused projection's rows are [q; k; v], each head after head (SelfAttention's view(..., 3, heads, dim))."""
    return weight.chunk(3, dim=0)


def or_zeros(state: dict, key: str, like: int) -> torch.Tensor:
    """A bias we have, or zeros where the family always has one and we had none (the same numbers)."""
    return state[key] if key in state else torch.zeros(like)


def per_layer(config, make) -> dict:
    """make(i, ours) -> {their name: tensor} over the layers, ours the prefix of our layer i."""
    out = {}
    for i in range(config.num_layers):
        out.update(make(i, f"encoder.layers.{i}."))
    return out
