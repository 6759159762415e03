"""Normalisation layers, by name (`arch.norm`)."""

from torch import nn

from .registry import Registry

NORMS = Registry("norm")


@NORMS.register("layernorm")
class LayerNorm(nn.LayerNorm):
    def __init__(self, dim: int, eps: float, bias: bool):
        super().__init__(dim, eps=eps, bias=bias)


@NORMS.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    def __init__(self, dim: int, eps: float, bias: bool):
        # RMSNorm has no bias by definition; `bias` is accepted so all norms share one signature.
        super().__init__(dim, eps=eps)


def build_norm(config) -> nn.Module:
    return NORMS.get_or_explain(config.norm)(config.hidden_size, config.norm_eps, config.bias)

