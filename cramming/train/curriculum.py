"""The sequence-length curriculum (`train.seq_schedule`, Shortformer-style): short sequences first, longer later,
all cut from the same token stream.

Stages are [budget_fraction, seq_length] pairs whose fractions add up to 1; every length is a multiple k of
data.seq_length. A stored row is [CLS] + S-1 tokens of the stream, and rows are consecutive chunks of it, so k
consecutive rows without their inner [CLS] are one longer sequence of k(S-1)+1 tokens, exactly the same text.
The loader deals rows in blocks of K = lcm(k) consecutive rows; a microbatch of m rows becomes m/k sequences,
so tokens per microbatch and per step stay the same, and the data position (rows consumed) moves identically
in every stage: switching stages never repeats or skips a token.
"""

import math

import torch

from ..model.modeling_crammed import BLOCKS
from ..model.patterns import PATTERNS
from ..model.positions import POSITIONS
from ..registry import invalid, listed
from .microbatch import microbatch_size


def stage_factors(seq_schedule, seq_length: int) -> list[tuple[float, int]]:
    """[(end of the stage as a fraction of the run, k)], from [[fraction, length], ...]; [(1.0, 1)] if none."""
    if not seq_schedule:
        return [(1.0, 1)]
    stages, end = [], 0.0
    for fraction, length in seq_schedule:
        end += fraction
        stages.append((end, int(length) // seq_length))
    return stages


def factor_at(stages: list[tuple[float, int]], progress: float) -> int:
    for end, factor in stages:
        if progress < end:
            return factor
    return stages[-1][1]


def block_rows(stages: list[tuple[float, int]]) -> int:
    return math.lcm(*(factor for _, factor in stages))


def sequence_length(seq_length: int, factor: int) -> int:
    """Tokens in a sequence of `factor` rows: one [CLS] and factor * (seq_length - 1) stream tokens."""
    return factor * (seq_length - 1) + 1


def regroup(rows: torch.Tensor, factor: int) -> torch.Tensor:
    """(m, S) consecutive rows -> (m / factor, factor * (S - 1) + 1): each group's rows joined, one [CLS]."""
    if factor == 1:
        return rows
    m, s = rows.shape
    body = rows.view(m // factor, factor, s)[:, :, 1:].reshape(m // factor, factor * (s - 1))
    return torch.cat([rows[::factor, :1], body], dim=1)


def seq_schedule_problem(c) -> str | None:
    """The curriculum's stages against the data, the batch and the architecture (c: a PretrainConfig)."""
    a, d = c.arch, c.data
    key, stages = "train.seq_schedule", c.train.seq_schedule
    fixed_blocks = [kind for kind in dict.fromkeys(a.layout) if BLOCKS.trait(kind, "fixed_length")]
    if not all(isinstance(stage, (list, tuple)) and len(stage) == 2 and all(isinstance(v, (int, float)) for v in stage)
               and stage[0] > 0 for stage in stages):
        return invalid(key, stages, "give [budget_fraction > 0, seq_length] pairs")
    if abs(sum(stage[0] for stage in stages) - 1) > 1e-6:
        return invalid(key, stages, "the stages' budget fractions must add up to 1")
    if d.ordering != "random":
        return invalid(key, stages, "needs data.ordering=random (rows are joined in stream order)")
    for _, length in stages:
        if length < d.seq_length or length % d.seq_length:
            return invalid(key, stages, f"every length must be a multiple of data.seq_length={d.seq_length}, "
                           f"got {length:g}")
        k = int(length) // d.seq_length
        tokens = sequence_length(d.seq_length, k)
        if c.impl.microbatch_size != "auto" and microbatch_size(c) % k:
            return invalid(key, stages, f"a {int(length)} stage joins {k} rows, so impl.microbatch_size must be a "
                           f"multiple of {k}")
        fixed = POSITIONS[a.position].table is not None or fixed_blocks
        if fixed and tokens > a.max_seq_length:
            blocks = "".join(f" and {kind}" for kind in fixed_blocks)
            return invalid(key, stages, f"its {tokens}-token sequences are longer than arch.max_seq_length="
                           f"{a.max_seq_length} ({a.position} positions{blocks} do not extrapolate); raise it, or "
                           f"use arch.position={listed(n for n in sorted(POSITIONS) if POSITIONS[n].table is None)}")
        for pattern in dict.fromkeys(a.attention.pattern):
            if problem := PATTERNS[pattern].problem(c, tokens, "the stage length"):
                return invalid(key, stages, f"a stage refused by arch.attention.pattern: {problem}")
    return None
