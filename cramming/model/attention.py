"""Multi-head self-attention. The kernel that computes softmax(QK^T/sqrt(d))V is chosen by name
(`impl.attention`): every kernel takes the same arguments and must give the same numbers.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from .registry import Registry

ATTENTION_KERNELS = Registry("attention kernel")


@ATTENTION_KERNELS.register("sdpa")
def sdpa_attention(q, k, v, key_padding_mask=None, dropout_p: float = 0.0):
    """PyTorch's fused kernels (flash / memory-efficient / math, picked by PyTorch)."""
    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


@ATTENTION_KERNELS.register("eager")
def eager_attention(q, k, v, key_padding_mask=None, dropout_p: float = 0.0):
    """The textbook formula: the reference the fused kernels are tested against."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    probs = F.dropout(probs, p=dropout_p, training=dropout_p > 0)
    return probs @ v


class SelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        if config.hidden_size % config.num_heads:
            raise ValueError(f"hidden_size {config.hidden_size} is not divisible by num_heads {config.num_heads}")
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.bias)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)
        self.dropout = config.attention_dropout
        self.kernel = ATTENTION_KERNELS.get_or_explain(config.attention_impl)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq_len, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq_len, 3, self.num_heads, hidden // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, seq, head_dim)
        dropout_p = self.dropout if self.training else 0.0
        y = self.kernel(q, k, v, key_padding_mask=key_padding_mask, dropout_p=dropout_p)
        return self.out(y.transpose(1, 2).reshape(batch, seq_len, hidden))
