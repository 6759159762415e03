"""The gMLP block (Liu et al. 2021, "Pay Attention to MLPs"), `arch.layout=[gmlp]`: a drop-in for the transformer
block (blocks.py).

Channels go up to ffn_size and split in two halves u and v; v is normalised and mixed across positions by a
learned (seq x seq) matrix, the spatial gating unit; u * v goes back down to the hidden size. With
`arch.gmlp.attn_dim` > 0 a tiny single-head attention of that width is added to the gate (aMLP). Causal models
use the lower triangle of the spatial matrix only."""

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .activations import ACTIVATIONS
from .attention import ATTENTION_KERNELS
from .attention_masks import AttentionSpec, same_document
from .blocks import BLOCKS
from .context import PLAIN, Context
from .linear import build_linear
from .norms import build_norm
from .registry import invalid


class TinyAttention(nn.Module):
    """aMLP's single-head attention, computed from the block input and projected to the gate's width."""

    def __init__(self, config, out_features: int):
        super().__init__()
        self.dim = config.gmlp.attn_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * self.dim, bias=config.bias)
        self.out = nn.Linear(self.dim, out_features, bias=config.bias)
        self.kernel = ATTENTION_KERNELS.get_or_explain(config.attention_impl)
        self.causal = config.causal

    def forward(self, x, ctx: Context = PLAIN):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)  # each (batch, 1 head, seq, dim)
        y = self.kernel(q, k, v, AttentionSpec(padding=ctx.padding, causal=self.causal, documents=ctx.documents))
        return self.out(y.squeeze(1))


@BLOCKS.register("gmlp")
class GMLPBlock(GradientCheckpointingLayer):
    """gMLP: a spatial gating unit mixes the tokens through a learned sequence-by-sequence matrix instead of
    attention (with arch.gmlp.attn_dim, aMLP: plus a tiny single-head attention)."""

    width_scaled = False  # the spatial gate's fan-in is the sequence, not the width: muP has no rule for it
    fixed_length = True  # the spatial gate is arch.max_seq_length square: no longer sequences

    @staticmethod
    def problem(config) -> str | None:
        """Its spatial matrix is max_seq_length square, and it splits ffn_size in halves."""
        a, seq_length = config.arch, config.data.seq_length
        if a.ffn_size % 2:
            return invalid("arch.ffn_size", a.ffn_size, "must be even for gmlp blocks (split in halves)")
        if seq_length > a.max_seq_length:
            return invalid("data.seq_length", seq_length, f"longer than the gmlp spatial matrix "
                           f"(arch.max_seq_length={a.max_seq_length}); raise it")
        return None

    def __init__(self, config, index: int = 0):
        super().__init__()
        self.half = half = config.ffn_size // 2
        self.pre_norm = config.norm_position == "pre"
        self.norm = build_norm(config)
        self.up = build_linear(config, "ffn", config.hidden_size, config.ffn_size)
        self.act = ACTIVATIONS.get_or_explain(config.activation)
        self.gate_norm = build_norm(config, half)
        # Near-identity start (weights 0, bias 1: the gate passes u through), as the paper recommends.
        self.spatial = nn.Parameter(torch.zeros(config.max_seq_length, config.max_seq_length))
        self.spatial_bias = nn.Parameter(torch.ones(config.max_seq_length))
        self.tiny_attention = TinyAttention(config, half) if config.gmlp.attn_dim > 0 else None
        self.down = build_linear(config, "ffn", half, config.hidden_size)
        self.down.residual_output = True
        self.causal = config.causal
        self.dropout = nn.Dropout(config.hidden_dropout)

    def init_weights_(self, init, std: float) -> None:
        """The spatial gate starts as the identity on u (its linear layers initialise themselves)."""
        init.zeros_(self.spatial)
        init.ones_(self.spatial_bias)

    def gate(self, x, ctx: Context):
        seq_len = x.shape[1]
        u, v = self.act(self.up(x)).chunk(2, dim=-1)
        v = self.gate_norm(v)
        if ctx.padding is not None:  # padding must not leak into real positions through the mixing
            v = v * ctx.padding[..., None].to(v.dtype)
        weight, bias = self.spatial[:seq_len, :seq_len], self.spatial_bias[:seq_len, None]
        if ctx.positions is not None:  # each row's own (position_ids): a left-padded row mixes as it would alone
            ids = ctx.positions.ids
            weight, bias = self.spatial[ids[:, :, None], ids[:, None, :]], self.spatial_bias[ids][..., None]
        if self.causal:
            weight = weight.tril()  # by index: the real tokens' order, whatever padding precedes them
        if ctx.documents is not None:  # each document mixes only its own positions, as it would alone
            weight = weight * same_document(ctx.documents, ctx.documents)[:, 0].to(weight.dtype)
        v = torch.matmul(weight.to(v.dtype), v) + bias.to(v.dtype)  # (seq or batch x seq, seq) @ (batch, seq, d)
        if self.tiny_attention is not None:
            v = v + self.tiny_attention(x, ctx)
        return self.down(u * v)

    def forward(self, x, ctx: Context = PLAIN):
        """ctx: this forward's context (context.py): padding, positions (position_ids: each row's own rows of the
        spatial matrix), documents."""
        if self.pre_norm:
            return x + self.dropout(self.gate(self.norm(x), ctx))
        return self.norm(x + self.dropout(self.gate(x, ctx)))
