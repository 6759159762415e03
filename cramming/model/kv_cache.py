"""What a KV cache needs beyond the attention itself: the name transformers gives it and one layer's slot (ALiBi's
bias for queries that do not start at position 0 is attention_masks.alibi_bias_at).

The cache is transformers' own `DynamicCache` (`generate` makes one): each attention block appends its new keys and
values, already rotated when the scheme is rotary, and gets back every key so far. New tokens sit at positions
past .. past + n - 1, the same positions the uncached forward gives them, unless position_ids say otherwise:
generation derives them from the attention mask (transformers' rule, context.position_ids_from_mask), so that a
left-padded prompt's tokens sit where they would alone.
"""

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

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
