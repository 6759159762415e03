"""The blocks a model is stacked from, by name (`arch.layout`, cycled over the layers): the transformer block
(attention then feed-forward, each a residual branch, normalised pre or post) and the gMLP block."""

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import SelfAttention
from .context import PLAIN, Context
from .ffn import FFNS
from .gmlp import GMLPBlock, linear_flops
from .norms import build_norm
from .registry import Registry

BLOCKS = Registry("block", traits={
    "kv_cache": "its forward takes a KV cache slot (kv_cache.py): generation may cache it",
    "token_subsets": "it may run on a subset of the tokens (arch.token_dropping), given their positions",
    "takes_value_embedding": "its attention mixes arch.value_embeddings' tables into the values",
    "width_scaled": "every weight's fan-in is the width: arch.parametrization=mup covers it",
    "fixed_length": "it holds arch.max_seq_length-sized weights: no sequences past arch.max_seq_length",
})
BLOCKS.register("gmlp")(GMLPBlock)


def cache_problem(config) -> str | None:
    """Why a model of these blocks cannot generate with a KV cache, or None. A block kind opts in with
    `kv_cache = True` (its forward takes `cache`); the others are refused, so generation recomputes the prefix
    instead of giving a wrong answer. gMLP is refused: its spatial gate mixes positions through a learned
    (seq x seq) matrix and keeps no keys and values; caching it would mean storing every layer's gate inputs."""
    kinds = sorted({kind for kind in config.layout if not BLOCKS.trait(BLOCKS.get_or_explain(kind), "kv_cache")})
    if not kinds:
        return None
    return (f"no KV cache for arch.layout={config.layout}: {', '.join(kinds)} blocks keep no keys and values (only "
            f"{BLOCKS.choices('kv_cache')} blocks do); generation recomputes the prefix at every step")


@BLOCKS.register("attention")
class TransformerBlock(GradientCheckpointingLayer):
    """Self-attention then the feed-forward block, each with its residual and norm (pre or post, arch.norm_position).
    A GradientCheckpointingLayer: with gradient checkpointing on (transformers' gradient_checkpointing_enable, or
    impl.activation_checkpointing), it keeps only its input and runs again in the backward pass."""

    kv_cache = True  # its forward takes a LayerCache (kv_cache.py)
    token_subsets = True  # it may run on a subset of the tokens (arch.token_dropping), given their positions
    takes_value_embedding = True  # its attention mixes arch.value_embeddings' tables into the values
    width_scaled = True  # every weight's fan-in is the width: arch.parametrization=mup covers it

    def __init__(self, config, index: int = 0):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.norm1 = build_norm(config)
        self.attn = SelfAttention(config, index)
        self.norm2 = build_norm(config)
        self.ffn = FFNS.get_or_explain(config.ffn)(config)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.hidden_size, self.causal = config.hidden_size, config.causal

    def flops_per_token(self, seq_len: int) -> int:
        """The projections (each layer counts its own structure), then the scores and the weighted sum:
        4 * seq * hidden, half of it when causal (FlashAttention's convention: the masked half is skipped)."""
        return linear_flops(self) + 4 * seq_len * self.hidden_size // (2 if self.causal else 1)

    def forward(self, x: torch.Tensor, ctx: Context = PLAIN) -> torch.Tensor:
        """ctx: this forward's context (context.py), which the attention reads."""
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), ctx))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, ctx)))
        return self.norm2(x + self.dropout(self.ffn(x)))
