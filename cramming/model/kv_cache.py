"""What a KV cache needs beyond the attention itself: the name transformers gives it, one layer's slot, and ALiBi's
bias for queries that do not start at position 0.

The cache is transformers' own `DynamicCache` (`generate` makes one): each attention block appends its new keys and
values, already rotated when the scheme is rotary, and gets back every key so far. New tokens sit at absolute
positions past .. past + n - 1, the same positions the uncached forward gives them (left padding included: positions
count the padded tensor, as without a cache).
"""

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from .masks import alibi_slopes

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
