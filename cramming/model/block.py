"""One transformer layer: attention then feed-forward, each a residual branch, normalised pre or post."""

import torch
from torch import nn

from .attention import SelfAttention
from .ffn import FFNS
from .norms import build_norm


class TransformerBlock(nn.Module):
    def __init__(self, config, layer_index: int = 0):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.norm1 = build_norm(config)
        self.attn = SelfAttention(config, layer_index)
        self.norm2 = build_norm(config)
        self.ffn = FFNS.get_or_explain(config.ffn)(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), key_padding_mask))
            return x + self.dropout(self.ffn(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, key_padding_mask)))
        return self.norm2(x + self.dropout(self.ffn(x)))
