"""Multi-head self-attention. The kernel that computes softmax(QK^T/sqrt(d) + bias)V is chosen by name
(`impl.attention`): every kernel takes the same arguments and must give the same numbers.

What a query may see is described by four arguments shared by all kernels:
- key_padding_mask: (batch, seq) bool, True = a real token;
- causal: a query sees only keys at or before it (decoders);
- window: a query at i sees keys j with |i - j| <= window (bidirectional), or 0 <= i - j <= window (causal);
- alibi: add -slope_h * |i - j| to the scores of head h (Press et al. 2022, symmetric as in MosaicBERT).
A query that sees no key at all gets a zero output, as PyTorch's SDPA does.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from .linear import build_linear
from .norms import build_norm
from .registry import Registry
from .rotary import ROTARY_IMPLS, rotary_cos_sin

ATTENTION_KERNELS = Registry("attention kernel")


def alibi_slopes(num_heads: int) -> list[float]:
    """The geometric slopes of ALiBi: 2^(-8h/n) for n a power of two; otherwise the n' = 2^floor(log2 n) slopes
    followed by every other slope of 2n' (the paper's recipe for other head counts)."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-8.0 * (2 * i + 1) / (2 * n)) for i in range(num_heads - n)]
    return slopes


def visible_keys(seq_len: int, causal: bool, window: int | None, key_padding_mask, device) -> torch.Tensor | None:
    """Which keys each query may see: a bool (batch or 1, 1, seq, seq) tensor, or None when all of them."""
    if not causal and window is None and key_padding_mask is None:
        return None
    pos = torch.arange(seq_len, device=device)
    offset = pos[:, None] - pos[None, :]  # query index minus key index
    visible = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    if causal:
        visible &= offset >= 0
    if window is not None:
        visible &= offset.abs() <= window
    visible = visible[None, None]
    if key_padding_mask is not None:
        visible = visible & key_padding_mask[:, None, None, :].bool()
    return visible


def alibi_bias(seq_len: int, num_heads: int, device) -> torch.Tensor:
    """(1, heads, seq, seq) fp32: -slope_h * |i - j|."""
    pos = torch.arange(seq_len, device=device)
    distance = (pos[:, None] - pos[None, :]).abs().float()
    slopes = torch.tensor(alibi_slopes(num_heads), device=device)
    return (-slopes[:, None, None] * distance)[None]


@ATTENTION_KERNELS.register("sdpa")
def sdpa_attention(q, k, v, key_padding_mask=None, causal=False, window=None, alibi=False, dropout_p=0.0):
    """PyTorch's fused kernels (flash / memory-efficient / math, picked by PyTorch from the mask it gets)."""
    if key_padding_mask is None and window is None and not alibi:  # the flash backend handles these itself
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    mask = visible_keys(q.shape[2], causal, window, key_padding_mask, q.device)
    if alibi:
        bias = alibi_bias(q.shape[2], q.shape[1], q.device)
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


@ATTENTION_KERNELS.register("eager")
def eager_attention(q, k, v, key_padding_mask=None, causal=False, window=None, alibi=False, dropout_p=0.0):
    """The textbook formula, in fp32: the reference the fused kernels are tested against."""
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if alibi:
        scores = scores + alibi_bias(q.shape[2], q.shape[1], q.device)
    visible = visible_keys(q.shape[2], causal, window, key_padding_mask, q.device)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if visible is not None:  # a query that sees nothing: softmax gave NaN, the convention is zero output
        probs = probs.masked_fill(~visible.any(-1, keepdim=True), 0.0)
    probs = F.dropout(probs, p=dropout_p, training=dropout_p > 0)
    return (probs @ v.float()).to(q.dtype)


class SelfAttention(nn.Module):
    def __init__(self, config, layer_index: int = 0):
        super().__init__()
        if config.hidden_size % config.num_heads:
            raise ValueError(f"hidden_size {config.hidden_size} is not divisible by num_heads {config.num_heads}")
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.qkv = build_linear(config, "attention", config.hidden_size, 3 * config.hidden_size)
        self.out = build_linear(config, "attention", config.hidden_size, config.hidden_size)
        self.out.residual_output = True  # scaled down by arch.init=megatron-scaled
        # QK-norm (Dehghani et al. 2023): normalise each head's queries and keys, bounding the attention logits.
        self.q_norm = build_norm(config, self.head_dim) if config.qk_norm else nn.Identity()
        self.k_norm = build_norm(config, self.head_dim) if config.qk_norm else nn.Identity()
        self.dropout = config.attention_dropout
        self.kernel = ATTENTION_KERNELS.get_or_explain(config.attention_impl)
        self.causal = config.objective == "clm"
        pattern = config.attention_pattern[layer_index % len(config.attention_pattern)]
        self.window = config.attention_window if pattern == "local" else None
        self.alibi = config.position == "alibi"
        self.rotary = None
        if config.position == "rotary":
            self.rotary = ROTARY_IMPLS.get_or_explain(config.rotary_impl)
            self.rotary_pct, self.rotary_base = config.rotary_pct, config.rotary_base
            self.rotary_interleaved = config.rotary_interleaved

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq_len, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, heads, seq, head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            rotary_dim = int(self.head_dim * self.rotary_pct) // 2 * 2
            cos, sin = rotary_cos_sin(seq_len, rotary_dim, self.rotary_base, x.device, torch.float32)
            q = self.rotary(q, cos, sin, None, self.rotary_pct, self.rotary_interleaved)
            k = self.rotary(k, cos, sin, None, self.rotary_pct, self.rotary_interleaved)
        dropout_p = self.dropout if self.training else 0.0
        y = self.kernel(q, k, v, key_padding_mask=key_padding_mask, causal=self.causal, window=self.window,
                        alibi=self.alibi, dropout_p=dropout_p)
        return self.out(y.transpose(1, 2).reshape(batch, seq_len, hidden))
