"""Attention patterns by name (`arch.attention.pattern`, cycled over the attention blocks): which keys a query
may see. A pattern turns the config into the mask fields of the attention spec every kernel takes (window,
stepped, topk of attention_masks.AttentionSpec; their meaning: attention_masks.py), says which settings it refuses,
and gives its mask for queries that do not start at position 0 (the new tokens of a KV cache, `visible`). Global
attention is here; the patterns that hide keys are sparse_patterns.py. A new pattern is a class registered here, in
a file of its own (docs/extending.md).
"""

from .arch import AttentionConfig
from .registry import Registry

PATTERNS = Registry("attention pattern", traits={
    "windowed": "its mask depends on arch.attention.window (train.window_schedule changes it)",
    "token_subsets": "its mask holds on a subset of the tokens (arch.token_dropping): it reads no positions",
    "absolute": "its mask depends on where the tokens are, not only on how far apart (attention.attend_at)",
})
PATTERNS.serves(AttentionConfig, "pattern")


@PATTERNS.register_one("global")
class Global:
    """Every query sees every key."""

    kernel_note = None  # why a kernel lacking this pattern's arguments cannot compute it, where not obvious
    windowed = False  # its mask depends on arch.attention.window (train.window_schedule changes it)
    token_subsets = True  # its mask holds on a subset of the tokens (arch.token_dropping): it reads no positions
    # its mask depends on where the tokens are, not only on how far apart: given position_ids (left-padded
    # generation), it is computed at them instead of at the tensor's indices (attention.attend_at)
    absolute = False

    def kernel_args(self, config) -> dict:
        """This pattern's fields of the kernels' AttentionSpec, by name (config: a CrammedConfig)."""
        return {}

    def visible(self, query_pos, key_pos, **kernel_args):
        """Which keys the queries at query_pos may see, by this pattern alone (causality and padding come on top):
        a (queries, keys) bool tensor, or None for all of them; positions of shape (batch, n) give (batch, queries,
        keys). kernel_args: the spec's window, stepped and topk (None where unset). The rule of attention_masks.py, at
        absolute positions."""
        return None

    def problem(self, config, seq_length: int | None = None, length_name: str = "data.seq_length") -> str | None:
        """What this pattern refuses for sequences of seq_length tokens (config: a PretrainConfig; by default
        data.seq_length), or None; length_name says in the message where that length comes from."""
        return None
