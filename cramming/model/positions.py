"""Position schemes by name (`arch.position`).

Each takes the sequence length and returns a (seq_len, hidden) tensor to add to the token embeddings, or None
for the schemes that act inside attention instead (rotary, alibi, rpe: see attention.py, rpe.py).
"""

import math

import torch
from torch import nn

from .registry import Registry

POSITIONS = Registry("position")


def sinusoid_table(length: int, dim: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


@POSITIONS.register("learned")
class LearnedPositions(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embedding = nn.Embedding(config.max_seq_length, config.hidden_size)

    def forward(self, seq_len: int) -> torch.Tensor:
        return self.embedding.weight[:seq_len]


@POSITIONS.register("sinusoidal")
class SinusoidalPositions(nn.Module):
    """The fixed table of "Attention is all you need"."""

    def __init__(self, config):
        super().__init__()
        self.register_buffer("table", sinusoid_table(config.max_seq_length, config.hidden_size), persistent=False)

    def forward(self, seq_len: int) -> torch.Tensor:
        return self.table[:seq_len]


@POSITIONS.register("scaled-sinusoidal")
class ScaledSinusoidalPositions(SinusoidalPositions):
    """Sinusoids times one learned scalar (Hua et al. 2022), initialised at 1/sqrt(hidden): Cramming's choice."""

    def __init__(self, config):
        super().__init__(config)
        self.scale = nn.Parameter(torch.full((1,), 1.0 / math.sqrt(config.hidden_size)))  # 1-D for FSDP2

    def forward(self, seq_len: int) -> torch.Tensor:
        return self.scale * self.table[:seq_len]


@POSITIONS.register("none")
@POSITIONS.register("rotary")
@POSITIONS.register("alibi")
@POSITIONS.register("rpe")
class NoPositions(nn.Module):
    """Nothing added to the embeddings: no positions at all (NoPE), or positions applied in attention."""

    def __init__(self, config):
        super().__init__()

    def forward(self, seq_len: int):
        return None
