"""What a query may see and what is added to its scores: the definitions every attention kernel follows. A kernel
is `fn(q, k, v, spec: AttentionSpec) -> out`; the spec's fields:

- padding: (batch, seq) bool, True = a real token;
- causal: a query sees only keys at or before it (decoders);
- window: a query at i sees keys j with |i - j| <= window (bidirectional), or 0 <= i - j <= window (causal);
- stepped: fixed blocks of `stepped` tokens; a query sees the keys of its own block and of the previous one;
- alibi: add -slope_h * |i - j| to the scores of head h (Press et al. 2022, symmetric as in MosaicBERT);
- bias: any additive (1 or batch, heads, seq, seq) score bias (the T5 relative-position bias);
- topk: keep only the k largest scores of each query before the softmax (needs the scores: eager only);
- documents: (batch, seq) document ids of a packed row: a query sees only keys of its own document
  (data.document_masking);
- dropout_p: attention dropout on the probabilities;
- scale: the score scale, None for the usual 1/sqrt(head_dim) (arch.parametrization sets muP's 1/d).
A query that sees no key at all gets a zero output, as PyTorch's SDPA does.
"""

import math
from typing import NamedTuple

import torch


class AttentionSpec(NamedTuple):
    """One attention call's mask, bias, dropout and scale (meanings above). Immutable: SelfAttention builds the
    static part once and each forward adds its tensors with `_replace`."""

    padding: torch.Tensor | None = None
    causal: bool = False
    window: int | None = None
    stepped: int | None = None
    topk: int | None = None
    alibi: bool = False
    bias: torch.Tensor | None = None
    documents: torch.Tensor | None = None
    dropout_p: float = 0.0
    scale: float | None = None


def alibi_slopes(num_heads: int) -> list[float]:
    """The geometric slopes of ALiBi: 2^(-8h/n) for n a power of two; otherwise the n' = 2^floor(log2 n) slopes
    followed by every other slope of 2n' (the paper's recipe for other head counts)."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    slopes += [2.0 ** (-8.0 * (2 * i + 1) / (2 * n)) for i in range(num_heads - n)]
    return slopes


def visible_keys(seq_len: int, causal: bool, window: int | None, padding, device,
                 stepped: int | None = None, documents=None) -> torch.Tensor | None:
    """Which keys each query may see: a bool (batch or 1, 1, seq, seq) tensor, or None when all of them."""
    if not causal and window is None and padding is None and stepped is None and documents is None:
        return None
    pos = torch.arange(seq_len, device=device)
    offset = pos[:, None] - pos[None, :]  # query index minus key index
    visible = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    if causal:
        visible &= offset >= 0
    if window is not None:
        visible &= offset.abs() <= window
    if stepped is not None:
        block_offset = pos[:, None] // stepped - pos[None, :] // stepped
        visible &= (block_offset == 0) | (block_offset == 1)
    visible = visible[None, None]
    if padding is not None:
        visible = visible & padding[:, None, None, :].bool()
    if documents is not None:
        visible = visible & same_document(documents, documents)
    return visible


def same_document(query_documents: torch.Tensor, key_documents: torch.Tensor) -> torch.Tensor:
    """(batch, 1, queries, keys) bool: the key is in the query's document."""
    return (query_documents[:, :, None] == key_documents[:, None, :])[:, None]


def alibi_bias(seq_len: int, num_heads: int, device) -> torch.Tensor:
    """(1, heads, seq, seq) fp32: -slope_h * |i - j|."""
    pos = torch.arange(seq_len, device=device)
    distance = (pos[:, None] - pos[None, :]).abs().float()
    slopes = torch.tensor(alibi_slopes(num_heads), device=device)
    return (-slopes[:, None, None] * distance)[None]


def alibi_bias_at(query_pos: torch.Tensor, key_pos: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(1, heads, queries, keys) fp32: -slope_h * |i - j| for the given positions (alibi_bias's values)."""
    distance = (query_pos[:, None] - key_pos[None, :]).abs().float()
    slopes = torch.tensor(alibi_slopes(num_heads), device=query_pos.device)
    return (-slopes[:, None, None] * distance)[None]
