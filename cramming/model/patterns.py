"""Attention patterns by name (`arch.attention.pattern`, cycled over the attention blocks): which keys a query
may see. A pattern turns the config into the mask fields of the attention spec every kernel takes (window,
stepped, topk of attention_masks.AttentionSpec; their meaning: attention_masks.py), says which settings it refuses,
and gives its mask for queries that do not start at position 0 (the new tokens of a KV cache, `visible`). A new
pattern is one class here plus its registry line.
"""

from .arch import AttentionConfig
from .registry import Registry, invalid

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


@PATTERNS.register_one("local")
class Local(Global):
    """A sliding window: keys within arch.attention.window positions of the query (ModernBERT's local layers)."""

    windowed = True
    token_subsets = False

    def kernel_args(self, config) -> dict:
        return {"window": config.attention.window}

    def visible(self, query_pos, key_pos, window=None, **unused):
        return (query_pos[..., :, None] - key_pos[..., None, :]).abs() <= window

    def problem(self, config, seq_length: int | None = None, length_name: str = "data.seq_length") -> str | None:
        w, seq_length = config.arch.attention.window, seq_length or config.data.seq_length
        if not 1 <= w <= seq_length:
            return invalid("arch.attention.window", w,
                           f"must be in [1, {length_name}={seq_length}] for local attention")
        return None


@PATTERNS.register_one("stepped")
class Stepped(Global):
    """Fixed blocks of arch.attention.window tokens; a query sees its own block and the one before."""

    windowed = True
    token_subsets = False
    absolute = True  # the blocks start at position 0: left padding would shift them

    def kernel_args(self, config) -> dict:
        return {"stepped": config.attention.window}

    def visible(self, query_pos, key_pos, stepped=None, **unused):
        block_offset = query_pos[..., :, None] // stepped - key_pos[..., None, :] // stepped
        return (block_offset == 0) | (block_offset == 1)

    def problem(self, config, seq_length: int | None = None, length_name: str = "data.seq_length") -> str | None:
        w, seq_length = config.arch.attention.window, seq_length or config.data.seq_length
        if w < 1 or seq_length % w:
            return invalid("arch.attention.window", w,
                           f"stepped attention needs a block length that divides {length_name}={seq_length}")
        return None


@PATTERNS.register_one("topk")
class TopK(Global):
    """Only the arch.attention.topk largest scores of each query (needs the scores: the eager kernel). Its mask is
    the scores' own, so `visible` is Global's: every key, of which the top k are kept."""

    kernel_note = "top-k attention keeps each query's largest scores, which a fused kernel never holds"

    def kernel_args(self, config) -> dict:
        return {"topk": config.attention.topk}

    def problem(self, config, seq_length: int | None = None, length_name: str = "data.seq_length") -> str | None:
        k, seq_length = config.arch.attention.topk, seq_length or config.data.seq_length
        if not 1 <= k <= seq_length:
            return invalid("arch.attention.topk", k, f"must be in [1, {length_name}={seq_length}]")
        return None
