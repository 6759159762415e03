"""Structured linear layers (`arch.linear`): matrices with fewer parameters and FLOPs than a dense one, each a
product of factors (a low-rank pair, a Kronecker product, Monarch's block-diagonal pair, block tensor-trains and
their mixture of experts). How they are built and initialised like a dense layer: linear.py.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from .linear import LinearMethods, check_linear, positive_int, register_linear
from .linear_btt import btt_count, btt_factors, btt_materialise, btt_multiply, btt_shapes, factorize


class Structured(LinearMethods, nn.Module):
    """A factored matrix plus an optional bias: forward = multiply + bias."""

    def __init__(self, in_features: int, out_features: int, bias: bool, **args):
        super().__init__()
        check_linear(self.kind, in_features, out_features, args)
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def init_weights_(self, init, std: float) -> None:
        """The model's init hook: the factors scaled like a dense layer of this std (reset_parameters_)."""
        self.reset_parameters_(std, init.normal_)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.multiply(x)
        return y if self.bias is None else y + self.bias.to(y.dtype)  # stays in the autocast dtype, as nn.Linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@register_linear("lowrank", structured=True)
class LowRank(Structured):
    """W = U V through a rank-r bottleneck; rank defaults to min(in, out) // 4."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, rank: int | None = None, **args):
        super().__init__(in_features, out_features, bias, rank=rank)
        self.rank = self.default_rank(in_features, out_features) if rank is None else rank
        self.V = nn.Parameter(torch.empty(self.rank, in_features))
        self.U = nn.Parameter(torch.empty(out_features, self.rank))
        self.reset_parameters_(in_features**-0.5, nn.init.normal_)

    @staticmethod
    def default_rank(in_features: int, out_features: int) -> int:
        return max(1, min(in_features, out_features) // 4)

    @classmethod
    def problem(cls, in_features, out_features, rank=None, **args):
        if rank is None:
            return None
        if not positive_int(rank):
            return f"lowrank rank={rank!r} must be a positive integer"
        if rank > min(in_features, out_features):
            return (f"lowrank rank={rank} exceeds min(in, out)={min(in_features, out_features)}: "
                    "a low-rank layer must be smaller")
        return None

    @classmethod
    def count_parameters(cls, in_features, out_features, rank=None, **args):
        rank = cls.default_rank(in_features, out_features) if rank is None else rank
        return rank * (in_features + out_features)

    def factors(self):
        return [(self.V, self.in_features), (self.U, self.rank)]

    def multiply(self, x):
        return F.linear(F.linear(x, self.V), self.U)

    def dense_weight(self):
        return self.U @ self.V


@register_linear("kronecker", structured=True)
class Kronecker(Structured):
    """W = A (x) B, the Kronecker product: W[i*b_out + k, j*b_in + l] = A[i, j] * B[k, l].

    in = a_in * b_in and out = a_out * b_out, each split by `factorize`: a is the largest divisor <= sqrt, so
    a <= b, as close to square as the number allows (a prime side stays whole: a = 1 there).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, **args):
        super().__init__(in_features, out_features, bias)
        (a_in, b_in), (a_out, b_out) = factorize(in_features, 2), factorize(out_features, 2)
        self.A = nn.Parameter(torch.empty(a_out, a_in))
        self.B = nn.Parameter(torch.empty(b_out, b_in))
        self.reset_parameters_(in_features**-0.5, nn.init.normal_)

    @classmethod
    def count_parameters(cls, in_features, out_features, **args):
        return sum(a * b for a, b in zip(factorize(in_features, 2), factorize(out_features, 2)))

    def factors(self):
        return [(self.B, self.B.shape[1]), (self.A, self.A.shape[1])]  # B first, see multiply

    def multiply(self, x):
        # With x viewed as a (a_in, b_in) matrix X, W x is A X B^T, flattened.
        (a_out, a_in), (b_out, b_in) = self.A.shape, self.B.shape
        x = torch.einsum("...jl,kl->...jk", x.reshape(*x.shape[:-1], a_in, b_in), self.B)
        return torch.einsum("ij,...jk->...ik", self.A, x).reshape(*x.shape[:-2], a_out * b_out)

    def dense_weight(self):
        return torch.kron(self.A, self.B)


@register_linear("monarch", structured=True)
class Monarch(Structured):
    """Monarch matrix (Dao et al., 2022): M = P L P^T R, with R and L block-diagonal, `blocks` blocks each.

    R maps each of the `blocks` input chunks to a chunk of the middle vector, of width min(in, out) as in the
    authors' rectangular layer. L's block l reads every blocks-th middle entry starting at l (the stride
    permutation P^T) and its outputs land at the same stride (P). Once blocks^2 <= min(in, out) every output sees
    every input; the default is the largest number of blocks dividing in and out that keeps that. blocks=1 is a
    product of two dense matrices.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, blocks: int | None = None, **args):
        super().__init__(in_features, out_features, bias, blocks=blocks)
        b = self.blocks = self.default_blocks(in_features, out_features) if blocks is None else blocks
        middle = min(in_features, out_features)
        self.R = nn.Parameter(torch.empty(b, middle // b, in_features // b))
        self.L = nn.Parameter(torch.empty(b, out_features // b, middle // b))
        self.reset_parameters_(in_features**-0.5, nn.init.normal_)

    @staticmethod
    def default_blocks(in_features: int, out_features: int) -> int:
        common, middle = math.gcd(in_features, out_features), min(in_features, out_features)
        return max(b for b in range(1, common + 1) if common % b == 0 and b * b <= middle)

    @classmethod
    def problem(cls, in_features, out_features, blocks=None, **args):
        if blocks is None:
            return None
        if not positive_int(blocks):
            return f"monarch blocks={blocks!r} must be a positive integer"
        if in_features % blocks or out_features % blocks:
            return f"monarch blocks={blocks} must divide in_features={in_features} and out_features={out_features}"
        return None

    @classmethod
    def count_parameters(cls, in_features, out_features, blocks=None, **args):
        blocks = cls.default_blocks(in_features, out_features) if blocks is None else blocks
        return min(in_features, out_features) * (in_features + out_features) // blocks

    def factors(self):
        return [(self.R, self.R.shape[2]), (self.L, self.L.shape[2])]

    def multiply(self, x):
        b, q, p = self.R.shape
        h = torch.einsum("...kp,kqp->...kq", x.reshape(*x.shape[:-1], b, p), self.R)  # middle index k*q + i
        y = torch.einsum("...ql,lsq->...sl", h.reshape(*h.shape[:-2], q, b), self.L)  # block l reads i*b + l
        return y.reshape(*y.shape[:-2], self.out_features)  # and writes output s*b + l

    def dense_weight(self):
        b, q, _ = self.R.shape
        s = self.L.shape[1]
        into_l = torch.arange(b * q).reshape(q, b).T.reshape(-1)  # L's input l*q + i is middle entry i*b + l
        out_of_l = torch.arange(b * s).reshape(b, s).T.reshape(-1)  # output t*b + l is L's output l*s + t
        return torch.block_diag(*self.L)[out_of_l] @ torch.block_diag(*self.R)[into_l]


@register_linear("btt", structured=True)
class BTT(Structured):
    """Block Tensor-Train (Qiu et al., 2024), a generalisation of Monarch (rank 1) and of tensor-train matrices.

    With in = n_1...n_c and out = m_1...m_c (see linear_btt), core t is a batch of small matrices, one for each
    value of the output indices before t and the input indices after t, mapping (n_t, rank) -> (m_t, rank).
    cores: 2 (default) or 3; rank: the BTT rank (default 1).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 cores: int | None = None, rank: int | None = None, **args):
        super().__init__(in_features, out_features, bias, cores=cores, rank=rank)
        self.num_cores, self.rank = cores or 2, rank or 1
        shapes = btt_shapes(in_features, out_features, self.num_cores, self.rank)
        self.cores = nn.ParameterList(nn.Parameter(torch.empty(shape)) for shape in shapes)
        self.reset_parameters_(in_features**-0.5, nn.init.normal_)

    @classmethod
    def problem(cls, in_features, out_features, cores=None, rank=None, **args):
        if cores is not None and not (positive_int(cores) and cores in (2, 3)):
            return f"btt cores={cores!r} is not supported: use 2 or 3"
        if rank is not None and not positive_int(rank):
            return f"btt rank={rank!r} must be a positive integer"
        return None

    @classmethod
    def count_parameters(cls, in_features, out_features, cores=None, rank=None, **args):
        return btt_count(in_features, out_features, cores or 2, rank or 1)

    def factors(self):
        return btt_factors(self.cores)

    def multiply(self, x):
        return btt_multiply(x.unsqueeze(-2), [core.unsqueeze(0) for core in self.cores]).squeeze(-2)

    def dense_weight(self):
        return btt_materialise([core.unsqueeze(0) for core in self.cores])[0]


@register_linear("btt-moe", structured=True)
class BTTMoE(Structured):
    """A mixture of `experts` BTT matrices (Potapczynski et al., 2024): a linear router scores the experts per
    token, and the token goes through the top `experts_k`, mixed by the softmax of their scores.

    Defaults: 8 experts, top 2, BTT cores=2, rank=1. This forward is the reference: every expert runs on every
    token (one einsum over the stacked experts per core) and gates that are zero outside the top k mix them.
    That is exact and simple but does all experts' work; train/flops.py counts the router plus the k experts a
    grouped kernel would run. Gathering each token's expert weights instead would cost k whole experts of memory
    per token, kept for backward.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, experts: int | None = None,
                 experts_k: int | None = None, cores: int | None = None, rank: int | None = None, **args):
        super().__init__(in_features, out_features, bias, experts=experts, experts_k=experts_k, cores=cores, rank=rank)
        self.experts, self.experts_k = self.default_experts(experts, experts_k)
        self.num_cores, self.rank = cores or 2, rank or 1
        shapes = btt_shapes(in_features, out_features, self.num_cores, self.rank)
        self.router = nn.Parameter(torch.empty(self.experts, in_features))
        self.cores = nn.ParameterList(nn.Parameter(torch.empty(self.experts, *shape)) for shape in shapes)
        self.reset_parameters_(in_features**-0.5, nn.init.normal_)

    @staticmethod
    def default_experts(experts, experts_k) -> tuple[int, int]:
        experts = 8 if experts is None else experts
        return experts, (min(2, experts) if experts_k is None else experts_k)

    @classmethod
    def problem(cls, in_features, out_features, experts=None, experts_k=None, cores=None, rank=None, **args):
        for name, value in (("experts", experts), ("experts_k", experts_k)):
            if value is not None and not positive_int(value):
                return f"btt-moe {name}={value!r} must be a positive integer"
        experts, experts_k = cls.default_experts(experts, experts_k)
        if experts_k > experts:
            return f"experts_k={experts_k} exceeds experts={experts}: a token cannot use more experts than exist"
        return BTT.problem(in_features, out_features, cores=cores, rank=rank)

    @classmethod
    def count_parameters(cls, in_features, out_features, experts=None, experts_k=None, cores=None, rank=None,
                         **args):
        experts, _ = cls.default_experts(experts, experts_k)
        return experts * (in_features + btt_count(in_features, out_features, cores or 2, rank or 1))

    def factors(self):
        return btt_factors(self.cores)

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """(..., experts) mixing weights: the softmax of the top-k router logits, zero for the other experts."""
        logits = x @ self.router.T
        top, index = logits.topk(self.experts_k, dim=-1)
        return torch.zeros_like(logits).scatter(-1, index, top.softmax(dim=-1))

    def multiply(self, x):
        every_expert = btt_multiply(x.unsqueeze(-2), self.cores)  # (..., experts, out)
        return torch.einsum("...e,...eo->...o", self.gates(x), every_expert)

    def dense_weight(self):
        """One matrix per expert, (experts, out, in); a token sees their mix by its gates(x)."""
        return btt_materialise(list(self.cores))

    @torch.no_grad()
    def reset_parameters_(self, std: float, normal_):
        # At init a token mixes k experts with weights near 1/k, which divides the entry variance by about k:
        # experts start at std * sqrt(k) so the mixed matrix has entries of variance ~std^2, as a dense layer.
        super().reset_parameters_(std * math.sqrt(self.experts_k), normal_)
        normal_(self.router, mean=0.0, std=std)
