"""Linear layers, by name (`arch.linear`): dense, or a structured matrix with fewer parameters and FLOPs
(structured_linear.py).

Every layer is built as (in_features, out_features, bias, **arch.linear_args) and picks out the arguments it
uses (rank, blocks, cores, experts, experts_k; None means the default), so one dict configures them all.
Each can materialise its matrix (`dense_weight`) and initialise itself like a dense layer (training counts
its FLOPs: cramming/train/flops.py).

Initialisation. A structured layer applies c factors one after another. Each gets the same share of the dense
layer's variance gain std^2 * in_features, so activations between factors stay between input and output scale:
    std_factor^2 = (std^2 * in_features)^(1/c) / fan_in_factor.
The fan-ins multiply to in_features times the number of products summed in one matrix entry, so the entries of
the materialised matrix get variance std^2 (averaged over entries where that number varies, as in Monarch).
"""

import math

import torch
from torch import nn

from .arch import ArchConfig
from .registry import Registry

# A layer's `problem` is about the shapes it is built with, not a run config: validation asks it for every projection
# (cramming/validation/across.py), so the schema walk asks nothing of the chosen entry.
LINEARS = Registry("linear layer", ask=lambda entry, config: None, traits={
    "structured": "a product of factors, not one matrix: no single fan-in (mup), no zero init (arch.zero_init_out)",
})
LINEARS.serves(ArchConfig, "linear")


def register_linear(name: str, **traits):
    def add(cls):
        cls.kind = name
        return LINEARS.register(name, **traits)(cls)

    return add


def linear_problem(kind: str, in_features: int, out_features: int, **args) -> str | None:
    """None when this layer can be built, else one sentence saying what is wrong and how to fix it."""
    try:
        cls = LINEARS.get_or_explain(kind)
    except ValueError as error:
        return str(error)
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if not positive_int(value):
            return f"{kind} {name}={value!r} must be a positive integer"
    return cls.problem(in_features, out_features, **args)


def build_linear(config, part: str, in_features: int, out_features: int) -> nn.Module:
    """The layer for one projection of `part` ("attention" or "ffn"): arch.linear where arch.linear_on names the
    part, dense elsewhere."""
    kind = config.linear if part in config.linear_on else "dense"
    return LINEARS.get_or_explain(kind)(in_features, out_features, config.bias, **config.linear_args.given())


def positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_linear(kind: str, in_features: int, out_features: int, args: dict):
    problem = linear_problem(kind, in_features, out_features, **args)
    if problem:
        raise ValueError(problem)


class LinearMethods:
    """The interface every linear layer has, written once for dense and structured layers alike."""

    @classmethod
    def problem(cls, in_features: int, out_features: int, **args) -> str | None:
        return None

    def factors(self) -> list[tuple[torch.Tensor, int]]:
        """The weight tensors in the order they are applied, each with its fan-in."""
        raise NotImplementedError

    @torch.no_grad()
    def reset_parameters_(self, std: float, normal_):
        """Entries of the materialised matrix ~ variance std^2, bias zero; normal_(tensor, mean, std) draws."""
        factors = self.factors()
        gain = (std**2 * self.in_features) ** (1 / len(factors))  # see the module docstring
        for weight, fan_in in factors:
            normal_(weight, mean=0.0, std=math.sqrt(gain / fan_in))
        if self.bias is not None:
            # A normal of std 0 is zeros, and normal_ keeps its rule of skipping tensors loaded from a checkpoint.
            normal_(self.bias, mean=0.0, std=0.0)


@register_linear("dense")
class Dense(LinearMethods, nn.Linear):
    """A plain nn.Linear: same parameter names, so dense checkpoints load unchanged."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, **args):
        check_linear("dense", in_features, out_features, {})
        super().__init__(in_features, out_features, bias=bias)

    @classmethod
    def count_parameters(cls, in_features: int, out_features: int, **args) -> int:
        return in_features * out_features

    def factors(self):
        return [(self.weight, self.in_features)]

    def dense_weight(self) -> torch.Tensor:
        return self.weight
