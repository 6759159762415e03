"""Normalisation layers by name (`arch.norm`), built by `build_norm` wherever a block normalises."""

import torch
from torch import nn

from .arch import ArchConfig
from .registry import Registry

NORMS = Registry("norm")
NORMS.serves(ArchConfig, "norm")


@NORMS.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """LayerNorm: each token's features centred and scaled to unit variance, with a learned gain (and bias)."""

    def __init__(self, dim: int, eps: float, bias: bool):
        super().__init__(dim, eps=eps, bias=bias)


@NORMS.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    """RMSNorm (Zhang & Sennrich 2019): scaled by the root mean square alone, no centring, a learned gain."""

    def __init__(self, dim: int, eps: float, bias: bool):
        # RMSNorm has no bias by definition; `bias` is accepted so all norms share one signature.
        super().__init__(dim, eps=eps)


@NORMS.register("scalenorm")
class ScaleNorm(nn.Module):
    """x * g / ||x|| with one learned scalar g, initialised at sqrt(dim) (Nguyen & Salazar 2019): no per-feature
    gain or bias, the cheapest norm that still fixes the scale."""

    def __init__(self, dim: int, eps: float, bias: bool):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.scale = nn.Parameter(torch.full((1,), dim**0.5))  # 1-D, not a scalar: FSDP2 shards only tensors

    def init_weights_(self, init, std: float) -> None:
        init.constant_(self.scale, self.dim**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (self.scale / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(self.eps))


def build_norm(config, dim: int | None = None) -> nn.Module:
    """A norm of the configured kind over `dim` features (default: the hidden size)."""
    return NORMS.get_or_explain(config.norm)(dim or config.hidden_size, config.norm_eps, config.bias)
