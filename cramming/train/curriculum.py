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
