"""Block Tensor-Train matrices (Qiu et al., 2024), the arithmetic behind the btt and btt-moe linear layers.

Write in = n_1...n_c and out = m_1...m_c, and index the input by (j_1..j_c) and the output by (i_1..i_c), the
first index slowest. With ranks r_0 = r_c = 1 and r_t = rank in between, a c-core BTT matrix is
    W[i, j] = sum over a_1..a_{c-1} of  prod_t G_t[i_1..i_{t-1}, j_{t+1}..j_c][i_t, a_t, j_t, a_{t-1}]:
core t holds one small (m_t r_t) x (n_t r_{t-1}) matrix for each value of the output indices before t and the
input indices after t. Stored with a leading experts axis E (1 for a plain BTT), core t has shape
    (E, n_{t+1}..n_c, m_1..m_{t-1}, m_t, r_t, n_t, r_{t-1}),
the two products flattened. Rank 1 with two cores is a Monarch matrix; cores that ignore the extra indices give
a tensor-train matrix.
"""

import math

import torch


def factorize(n: int, parts: int) -> list[int]:
    """n as `parts` factors, ascending and as equal as the divisors allow (greedily, the largest <= the root)."""
    factors = []
    for left in range(parts, 1, -1):
        factor = max(d for d in range(1, n + 1) if n % d == 0 and d**left <= n)
        factors.append(factor)
        n //= factor
    return sorted(factors + [n])


def btt_dims(in_features: int, out_features: int, cores: int) -> tuple[list[int], list[int]]:
    """(n_1..n_c, m_1..m_c). Core 1 costs in * m_1 * rank and core c costs out * n_c * rank, so the input
    factors go largest first and the output factors smallest first."""
    return factorize(in_features, cores)[::-1], factorize(out_features, cores)


def btt_shapes(in_features: int, out_features: int, cores: int, rank: int) -> list[tuple[int, ...]]:
    """Core shapes without the experts axis: (J, I, m_t, r_t, n_t, r_{t-1}), J and I the flattened products."""
    n, m = btt_dims(in_features, out_features, cores)
    ranks = [1] + [rank] * (cores - 1) + [1]
    return [(math.prod(n[t + 1:]), math.prod(m[:t]), m[t], ranks[t + 1], n[t], ranks[t]) for t in range(cores)]


def btt_count(in_features: int, out_features: int, cores: int, rank: int) -> int:
    """Parameters of one BTT matrix, in closed form."""
    n, m = btt_dims(in_features, out_features, cores)
    if cores == 2:
        return rank * (in_features * m[0] + out_features * n[1])
    return rank * (in_features * m[0] + rank * m[0] * m[1] * n[1] * n[2] + out_features * n[2])


def btt_factors(cores) -> list[tuple[torch.Tensor, int]]:
    """Each core with its fan-in n_t * r_{t-1}, for initialisation."""
    return [(core, core.shape[-2] * core.shape[-1]) for core in cores]


def btt_multiply(x: torch.Tensor, cores) -> torch.Tensor:
    """(..., E or 1, in) -> (..., E, out), one batched einsum per core.

    Before core t the activation holds (j_t, j_{t+1}..j_c, i_1..i_{t-1}, a_{t-1}) flattened; the core contracts
    (j_t, a_{t-1}) into (i_t, a_t), which leaves exactly the layout core t+1 expects.
    """
    for core in cores:
        _, J, I, _, _, n, r = core.shape
        x = torch.einsum("...enjia,ejimbna->...ejimb", x.reshape(*x.shape[:-1], n, J, I, r), core)
        x = x.flatten(-4)
    return x


def btt_materialise(cores) -> torch.Tensor:
    """The (E, out, in) matrices, straight from the index formula (independent of btt_multiply, for tests)."""
    first, last = cores[0][:, :, 0, :, :, :, 0], cores[-1][:, 0, :, :, 0]  # drop the axes of size 1
    if len(cores) == 2:
        w = torch.einsum("ekiaj,eilka->eiljk", first, last)  # [j2, i1, a, j1] and [i1, i2, j2, a]
    else:
        n3, m1, m2 = cores[1].shape[1:4]
        first = first.unflatten(1, (-1, n3))  # [j2, j3, i1, a, j1]
        last = last.unflatten(1, (m1, m2))  # [i1, i2, i3, j3, b]
        w = torch.einsum("evwiau,ewimbva,eimlwb->eimluvw", first, cores[1], last)  # middle: [j3, i1, i2, b, j2, a]
    out_features = math.prod(core.shape[3] for core in cores)
    in_features = math.prod(core.shape[-2] for core in cores)
    return w.reshape(w.shape[0], out_features, in_features)
