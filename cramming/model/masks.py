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
from transformers.modeling_outputs import CausalLMOutputWithPast

from .rotary import Positions
from .stacks import gather_tokens


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


# ---------------------------------------------------------------- what one forward tells every block
# What one forward tells every block besides the hidden state, in one object: the blocks and their attention
# read what they need from it, and a new per-forward input is one field here instead of one more argument through
# every layer.


class Context(NamedTuple):
    padding: torch.Tensor | None = None  # (batch, seq) bool, True = a real token; None: every token is real
    positions: Positions | None = None  # where the rows sit when not at their indices (rotary.Positions)
    documents: torch.Tensor | None = None  # (batch, seq) document ids: no attention across them (data.document_masking)
    bias: torch.Tensor | None = None  # an additive score bias shared by the layers (T5's relative-position bias)
    cache: object | None = None  # this layer's KV cache slot when generating (kv_cache.LayerCache)
    value_embedding: torch.Tensor | None = None  # this layer's value embedding (attention.py)
    hidden_states: list | None = None  # output_hidden_states: each block's output is appended (stacks.py)
    attentions: list | None = None  # output_attentions: each attention block appends its probabilities
    shared: dict | None = None  # what the layers of one cached step build once and share (attention.mask_at)

    def kept(self, keep: torch.Tensor, seq_len: int) -> "Context":
        """The context of the kept tokens alone (token dropping): their padding, document ids and positions."""
        ids = keep if self.positions is None else self.positions.ids.gather(1, keep)
        return self._replace(padding=None if self.padding is None else gather_tokens(self.padding, keep),
                             documents=None if self.documents is None else gather_tokens(self.documents, keep),
                             positions=Positions(ids, seq_len))


PLAIN = Context()  # a forward with nothing to tell: every token real, at its index, in one document, no cache


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position within its own document: 0 at the first token of every document (document ids do not
    decrease along a row)."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return index - torch.where(starts, index, 0).cummax(1).values


# ---------------------------------------------------------------- the KV cache
# What a KV cache needs beyond the attention itself: the name transformers gives it, one layer's slot, and ALiBi's
# bias for queries that do not start at position 0.
#
# The cache is transformers' own `DynamicCache` (`generate` makes one): each attention block appends its new keys and
# values, already rotated when the scheme is rotary, and gets back every key so far. New tokens sit at positions
# past .. past + n - 1, the same positions the uncached forward gives them, unless position_ids say otherwise:
# generation derives them from the attention mask (transformers' rule, `position_ids_from_mask`), so that a
# left-padded prompt's tokens sit where they would alone.


# transformers renamed `past_key_values` to `cache` (arguments and model outputs); use what the installed one reads.
CACHE_KEY = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class LayerCache:
    """One layer's entry in a transformers Cache; `past` is how many tokens it held before this forward."""

    def __init__(self, cache, index: int, past: int):
        self.cache, self.index, self.past = cache, index, past

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys and values; return all of them. A cache that keeps fewer or more (a sliding-window or
        a static cache) would need masks of its own: refused rather than misread."""
        new = k.shape[2]
        k, v = self.cache.update(k, v, self.index)
        if k.shape[2] != self.past + new:
            raise ValueError(f"the KV cache returned {k.shape[2]} keys for {self.past} cached + {new} new tokens; "
                             "crammed models need a cache that keeps every key (transformers' DynamicCache, the "
                             "default of generate)")
        return k, v


def alibi_bias_at(query_pos: torch.Tensor, key_pos: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(1, heads, queries, keys) fp32: -slope_h * |i - j| for the given positions (masks.alibi_bias's values)."""
    distance = (query_pos[:, None] - key_pos[None, :]).abs().float()
    slopes = torch.tensor(alibi_slopes(num_heads), device=query_pos.device)
    return (-slopes[:, None, None] * distance)[None]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position among the real tokens of its row, as transformers derives it for generation:
    cumsum(mask) - 1, and 1 on the padding (any valid row: padding is masked out as a key)."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)


def token_positions(position_ids, attention_mask, past: int, seq_len: int) -> Positions | None:
    """The per-forward Positions of the new tokens (rotary.Positions), or None for past .. past + seq_len - 1.
    With a cache, the cached keys' positions (which the stepped pattern reads) are derived from attention_mask,
    so beam search's reordering of the mask reorders them too."""
    if position_ids is None:
        return None
    batch = attention_mask.shape[0] if attention_mask is not None else position_ids.shape[0]
    if position_ids.dim() != 2 or position_ids.shape[1] != seq_len or position_ids.shape[0] not in (1, batch):
        raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}; it needs one position per new token: "
                         f"({batch}, {seq_len})")
    ids = position_ids.expand(batch, seq_len)
    if not past:
        return Positions(ids, past + seq_len)
    cached = (position_ids_from_mask(attention_mask)[:, :past] if attention_mask is not None
              else torch.arange(past, device=ids.device).expand(batch, past))
    return Positions(ids, past + seq_len, torch.cat([cached, ids], 1))
