"""What a family of transformers' architectures declares (families/__init__.py), and helpers its tensor map uses."""

import math
from abc import ABC, abstractmethod
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


class Family(ABC):
    """What a family declares; the methods below are what the export asks."""

    name: str  # --as <name>
    model_class: str  # transformers' class the folder loads as
    model_type: str  # its config.json's model_type
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

    @abstractmethod
    def config(self, config, special: dict):
        """transformers' config of the exported model. special: the tokenizer's ids (pad, bos, eos, cls, sep,
        mask; None where it has none)."""

    @abstractmethod
    def tensors(self, state: dict, config) -> dict:
        """The exported model's tensors from ours (`state`: the head's state dict)."""

    def back(self, theirs: dict, config, shapes: dict) -> dict:
        """Our head's tensors (`shapes`: their names and shapes) from an export's (`theirs`), by running `tensors`
        on numbered elements: each of ours is numbered, `tensors` moves the numbers where it moves values, and
        each number's place in their tensors is where that value is. A place holding no number of ours (a bias
        or table we lack, exported as zeros) must still be zero; None when it is not (trained since) or a shape
        differs."""
        numbers, start = {}, 1
        for key, shape in shapes.items():
            numbers[key] = torch.arange(start, start + math.prod(shape), dtype=torch.long).reshape(shape)
            start += math.prod(shape)
        if config.tie_embeddings:  # one matrix, two names
            numbers["decoder.weight"] = numbers["encoder.tokens.weight"]
        values = torch.zeros(start, dtype=torch.float32)
        found = torch.zeros(start, dtype=torch.bool)
        for key, where in self.tensors(numbers, config).items():
            if key not in theirs:
                continue  # tied in their file: its numbers come from the tensor it is tied to
            value = theirs[key]
            if tuple(value.shape) != tuple(where.shape):
                return None
            where, value = where.reshape(-1).long(), value.reshape(-1).float()
            ours = where > 0
            if value[~ours].any():
                return None
            values[where[ours]] = value[ours]
            found[where[ours]] = True
        out = {}
        for key, number in numbers.items():  # a tensor no family has (token dropping's running loss) is left out
            hit = found[number.reshape(-1)]
            if hit.any() and not hit.all():
                return None
            if hit.all():
                out[key] = values[number.reshape(-1)].reshape(number.shape)
        return out


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
