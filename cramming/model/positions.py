"""Position schemes by name (`arch.position`): each knows what it adds to the model and builds it.

A scheme adds at most one of: a table added to the token embeddings (learned, sinusoidal, scaled-sinusoidal),
a score bias shared by the layers (rpe, relative_bias.py), a rotation of queries and keys (rotary, rotary.py), or a
bias the attention kernels compute themselves (alibi, flagged by `alibi`). `none` adds nothing (NoPE). The model and
the attention ask the scheme; a new scheme is a class registered here, in a file of its own (docs/extending.md).
"""

import math

import torch
from torch import nn

from .arch import ArchConfig
from .registry import Registry, invalid

POSITIONS = Registry("position", traits={
    # its positions travel with the tokens, so layers may see a subset of them (arch.token_dropping): a table added
    # at the embedding, or rotary turned by each kept token's own position; not a bias over (seq x seq) distances
    "token_subsets": "its positions travel with the tokens: layers may see a subset of them (arch.token_dropping)",
    "alibi": "the attention kernels add ALiBi's distance bias themselves (attention_masks.py)",
    "learned_table": "its table is trained weights of arch.max_seq_length rows: a fine-tuning cannot make it longer",
})
POSITIONS.serves(ArchConfig, "position")


def sinusoid_table(length: int, dim: int) -> torch.Tensor:
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def rows(table: torch.Tensor, seq_len: int, offset: int, ids: torch.Tensor | None) -> torch.Tensor:
    """A position table's rows: (seq, dim) for positions offset onwards, or (batch, seq, dim) at the given ids."""
    return table[offset:offset + seq_len] if ids is None else table[ids]


class LearnedPositions(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embedding = nn.Embedding(config.max_seq_length, config.hidden_size)

    def forward(self, seq_len: int, offset: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of positions offset .. offset + seq_len - 1 (offset: tokens already in a KV cache), or of the
        (batch, seq) position ids when given (left padding: modeling_crammed.token_positions)."""
        return rows(self.embedding.weight, seq_len, offset, ids)


class SinusoidalPositions(nn.Module):
    """The fixed table of "Attention is all you need"."""

    def __init__(self, config):
        super().__init__()
        self.register_buffer("table", sinusoid_table(config.max_seq_length, config.hidden_size), persistent=False)

    def init_weights_(self, init, std: float) -> None:
        init.copy_(self.table, sinusoid_table(*self.table.shape))

    def forward(self, seq_len: int, offset: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
        return rows(self.table, seq_len, offset, ids)


class ScaledSinusoidalPositions(SinusoidalPositions):
    """Sinusoids times one learned scalar (Hua et al. 2022), initialised at 1/sqrt(hidden): Cramming's choice."""

    def __init__(self, config):
        super().__init__(config)
        self.scale = nn.Parameter(torch.full((1,), 1.0 / math.sqrt(config.hidden_size)))  # 1-D for FSDP2

    def init_weights_(self, init, std: float) -> None:
        super().init_weights_(init, std)
        init.constant_(self.scale, self.table.shape[1] ** -0.5)  # the table is hidden_size wide

    def forward(self, seq_len: int, offset: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.scale * rows(self.table, seq_len, offset, ids)


class NoPositions(nn.Module):
    """Nothing added to the embeddings: no positions at all (NoPE), or positions applied in attention."""

    def __init__(self, config):
        super().__init__()

    def forward(self, seq_len: int, offset: int = 0, ids=None):
        return None


class PositionScheme:
    """What every scheme answers; each hook returns None (or False) when the scheme does not use it."""

    table = None  # the nn.Module class of a table added to the token embeddings (max_seq_length rows)
    alibi = False  # the attention kernels add ALiBi's distance bias themselves (attention_masks.py)
    kernel_arg = None  # the attention kernels' argument this scheme needs (attention.FEATURES): alibi, bias
    token_subsets = False  # a trait (POSITIONS' traits): each scheme whose positions travel with the tokens says so

    def embedding(self, config) -> nn.Module:
        """What the embeddings add; a module that adds nothing when the scheme has no table."""
        return (self.table or NoPositions)(config)

    def score_bias(self, config) -> nn.Module | None:
        """A module giving the (1, heads, seq, seq) bias added to every layer's scores, or None."""
        return None

    def rotation(self, config, index: int):
        """What rotates the queries and keys of attention block `index` (rotary.Rotation), or None."""
        return None

    def problem(self, config) -> str | None:
        """What this scheme refuses in a PretrainConfig, in one line for the user, or None."""
        if self.table is not None and config.data.seq_length > config.arch.max_seq_length:
            return invalid("data.seq_length", config.data.seq_length,
                           f"longer than the {config.arch.position} position table "
                           f"(arch.max_seq_length={config.arch.max_seq_length}); raise it")
        return None


@POSITIONS.register_one("none")
class NoPE(PositionScheme):
    """No positions at all (NoPE): only a causal mask tells attention the order of the tokens."""

    token_subsets = True


@POSITIONS.register_one("learned")
class Learned(PositionScheme):
    """A trained table of arch.max_seq_length rows added to the token embeddings (BERT's)."""

    table = LearnedPositions
    token_subsets = True
    learned_table = True


@POSITIONS.register_one("sinusoidal")
class Sinusoidal(PositionScheme):
    """The fixed sine and cosine table of "Attention is all you need", added to the token embeddings."""

    table = SinusoidalPositions
    token_subsets = True


@POSITIONS.register_one("scaled-sinusoidal")
class ScaledSinusoidal(PositionScheme):
    """The sinusoid table times one learned scalar (Cramming's default): fixed shape, trained scale."""

    table = ScaledSinusoidalPositions
    token_subsets = True


@POSITIONS.register_one("alibi")
class ALiBi(PositionScheme):
    """ALiBi (Press et al. 2022): no table; each head's scores get a penalty linear in the distance."""

    alibi = True
    kernel_arg = "alibi"
