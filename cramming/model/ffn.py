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
