"""Activations by name (`arch.activation`): the feed-forward block's nonlinearity (and gMLP's). An entry is a
function of one tensor; a new one is `ACTIVATIONS.register(name, about=...)(fn)` (docs/extending.md)."""

from torch.nn import functional as F

from .arch import ArchConfig
from .registry import Registry

ACTIVATIONS = Registry("activation")
ACTIVATIONS.serves(ArchConfig, "activation")
ACTIVATIONS.register("gelu", about="GELU, x * Phi(x) (BERT's).")(F.gelu)
ACTIVATIONS.register("relu", about="ReLU, max(x, 0).")(F.relu)
ACTIVATIONS.register("silu", about="SiLU (swish), x * sigmoid(x): SwiGLU's gate with arch.ffn=glu.")(F.silu)
ACTIVATIONS.register("relu2", about="ReLU squared, max(x, 0)^2 (Primer; the GPT speedrun's MLP).")(
    lambda x: F.relu(x).square())
