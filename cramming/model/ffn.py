"""Feed-forward blocks, by name (`arch.ffn`), with the activation by name (`arch.activation`)."""

import torch
from torch import nn
from torch.nn import functional as F

from .linear import build_linear
from .registry import Registry, invalid

FFNS = Registry("ffn", traits={
    "gated": "its up projection is split into a gate and a value: the down projection takes ffn_size / 2",
})
ACTIVATIONS = Registry("activation")
ACTIVATIONS.register("gelu", about="GELU, x * Phi(x) (BERT's).")(F.gelu)
ACTIVATIONS.register("relu", about="ReLU, max(x, 0).")(F.relu)
ACTIVATIONS.register("silu", about="SiLU (swish), x * sigmoid(x): SwiGLU's gate with arch.ffn=glu.")(F.silu)
ACTIVATIONS.register("relu2", about="ReLU squared, max(x, 0)^2 (Primer; the GPT speedrun's MLP).")(
    lambda x: F.relu(x).square())


@FFNS.register("mlp")
class MLP(nn.Module):
    """Two projections, hidden -> ffn_size -> hidden, with the activation between (BERT's feed-forward)."""

    def __init__(self, config):
        super().__init__()
        self.up = build_linear(config, "ffn", config.hidden_size, config.ffn_size)
        self.down = build_linear(config, "ffn", config.ffn_size, config.hidden_size)
        self.down.residual_output = True  # scaled down by arch.init=megatron-scaled
        self.act = ACTIVATIONS.get_or_explain(config.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


@FFNS.register("glu")
class GLU(nn.Module):
    """Gated linear unit: one projection to ffn_size, split in halves, act(a) * b, back from ffn_size / 2.

    This is Cramming's form: the GLU halves the width and is not rescaled to keep parameters equal.
    """

    gated = True

    @staticmethod
    def problem(config) -> str | None:
        if config.arch.ffn_size % 2:
            return invalid("arch.ffn_size", config.arch.ffn_size, "must be even for a GLU")
        return None

    def __init__(self, config):
        super().__init__()
        if config.ffn_size % 2:
            raise ValueError(f"ffn_size {config.ffn_size} is odd: a GLU splits it in halves")
        self.up = build_linear(config, "ffn", config.hidden_size, config.ffn_size)
        self.down = build_linear(config, "ffn", config.ffn_size // 2, config.hidden_size)
        self.down.residual_output = True
        self.act = ACTIVATIONS.get_or_explain(config.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * value)


# ---------------------------------------------------------------- normalisation layers
# Normalisation layers, by name (`arch.norm`).


NORMS = Registry("norm")


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
