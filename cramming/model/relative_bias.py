"""T5's relative-position bias (`arch.position=rpe`, arch.rpe): a learned scalar per head for each bucket of relative
distance, added to the attention scores. Small distances get a bucket each, larger ones share logarithmically wider
buckets up to `arch.rpe.max_distance`, beyond which all share the last. Bidirectional models split the buckets
between keys before and after the query; causal models only look back.
"""

import math

import torch
from torch import nn

from .positions import POSITIONS, PositionScheme
from .registry import invalid


@POSITIONS.register_one("rpe")
class T5RelativeBias(PositionScheme):
    """T5's relative-position bias: a learned score per head and log-spaced distance bucket (arch.rpe)."""

    kernel_arg = "bias"

    def score_bias(self, config) -> nn.Module:
        return RelativePositionBias(config)

    def problem(self, config) -> str | None:
        rpe = config.arch.rpe  # its own ranges: RPEConfig.RULES
        if rpe.max_distance < rpe.buckets:
            return invalid("arch.rpe.max_distance", rpe.max_distance, f"must be >= arch.rpe.buckets={rpe.buckets}")
        return None


def relative_buckets(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int):
    """Bucket index for each relative position (key index minus query index)."""
    offset = 0
    if bidirectional:
        num_buckets //= 2
        offset = (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp_min(0)
    exact = num_buckets // 2
    log_ratio = torch.log(distance.float().clamp_min(1) / exact) / math.log(max_distance / exact)
    far = (exact + (log_ratio * (num_buckets - exact)).long()).clamp_max(num_buckets - 1)
    return offset + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.bidirectional = not config.causal
        self.num_buckets, self.max_distance = config.rpe.buckets, config.rpe.max_distance
        self.embedding = nn.Embedding(config.rpe.buckets, config.num_heads)

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        """(1, heads, seq, offset + seq) bias of the queries at offset .. offset + seq - 1 (offset: tokens already
        in a KV cache) against every key up to them."""
        pos = torch.arange(offset + seq_len, device=self.embedding.weight.device)
        buckets = relative_buckets(pos[None, :] - pos[offset:, None], self.bidirectional, self.num_buckets,
                                   self.max_distance)
        return self.embedding(buckets).permute(2, 0, 1)[None]
