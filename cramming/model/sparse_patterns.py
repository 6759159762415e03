"""The attention patterns that hide keys from a query (`arch.attention.pattern`): a sliding window (local), fixed
blocks (stepped) and each query's largest scores (topk). What a pattern answers: patterns.py.
"""

from .patterns import PATTERNS, Global
from .registry import invalid


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
