"""What a KV cache needs beyond the attention itself: the name transformers gives it, one layer's slot, and ALiBi's
bias for queries that do not start at position 0.

The cache is transformers' own `DynamicCache` (`generate` makes one): each attention block appends its new keys and
values, already rotated when the scheme is rotary, and gets back every key so far. New tokens sit at positions
past .. past + n - 1, the same positions the uncached forward gives them, unless position_ids say otherwise:
generation derives them from the attention mask (transformers' rule, `position_ids_from_mask`), so that a
left-padded prompt's tokens sit where they would alone.
"""

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from .masks import alibi_slopes
from .rotary import Positions

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
