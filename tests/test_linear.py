"""Structured linear layers: each equals its materialised matrix, has its closed-form size, and inits like dense."""

import itertools
import math

import pytest
import torch

from cramming.model.linear import LINEARS, linear_problem
from cramming.model.structured_linear import BTTMoE
from cramming.train.flops import counter

SHAPES = [(16, 64), (64, 16), (24, 24)]
# Kinds with their non-default settings worth covering; every kind also runs with its defaults.
VARIANTS = [(kind, {}) for kind in sorted(LINEARS)] + [
    ("lowrank", {"rank": 3}),
    ("monarch", {"blocks": 2}),
    ("btt", {"cores": 3, "rank": 2}),
    ("btt-moe", {"experts": 3, "experts_k": 1, "cores": 3}),
]


def build(kind, in_features, out_features, seed=0, **args):
    torch.manual_seed(seed)
    return LINEARS[kind](in_features, out_features, **args)


def expected_parameters(kind, in_features, out_features, bias=False, **args):
    """The parameter count in closed form: the kind's own formula, plus the bias."""
    return LINEARS[kind].count_parameters(in_features, out_features, **args) + (out_features if bias else 0)


def dense_weight_for(layer, x):
    """The matrix applied to each token of x: the same for every token, except that btt-moe mixes its experts'
    matrices by each token's gates."""
    if isinstance(layer, BTTMoE):
        return torch.einsum("...e,eoi->...oi", layer.gates(x), layer.dense_weight())
    return layer.dense_weight()


def apply(weight, x):
    """weight (out, in) or per token (..., out, in) applied to x (..., in)."""
    return (weight @ x.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("kind,args", VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_is_the_materialised_matrix(kind, args, shape):
    layer = build(kind, *shape, bias=True, **args)
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(2, 3, shape[0])
    y = layer(x)
    assert y.shape == (2, 3, shape[1])
    torch.testing.assert_close(y, apply(dense_weight_for(layer, x), x) + layer.bias, atol=1e-5, rtol=1e-5)
    y.square().sum().backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in layer.parameters())


@pytest.mark.parametrize("kind,args", VARIANTS, ids=lambda v: str(v))
@pytest.mark.parametrize("bias", [False, True])
def test_parameter_count_is_closed_form(kind, args, bias):
    for shape in SHAPES:
        layer = build(kind, *shape, bias=bias, **args)
        assert sum(p.numel() for p in layer.parameters()) == expected_parameters(kind, *shape, bias, **args)


@pytest.mark.parametrize("kind,args", VARIANTS, ids=lambda v: str(v))
def test_init_gives_the_entry_std_of_a_dense_layer(kind, args):
    stds = []
    for seed in range(3):
        layer = build(kind, 64, 256, seed=seed, **args)
        layer.reset_parameters_(0.02, torch.nn.init.normal_)
        weight = dense_weight_for(layer, torch.randn(8, 64))  # per token for btt-moe
        stds.append(weight.flatten(-2).std(dim=-1).mean().item())
    assert sum(stds) / len(stds) == pytest.approx(0.02, rel=0.25)


def test_init_zeroes_the_bias():
    for kind in LINEARS:
        layer = build(kind, 16, 64, bias=True)
        layer.reset_parameters_(0.02, torch.nn.init.normal_)
        assert torch.equal(layer.bias, torch.zeros(64))


@pytest.mark.parametrize("kind,args", VARIANTS, ids=lambda v: str(v))
def test_structured_layers_cost_less_than_dense(kind, args):
    layer = build(kind, 256, 1024, **args)
    if kind == "dense":
        assert layer_flops(layer) == 2 * 256 * 1024
    else:
        assert layer_flops(layer) < 2 * 256 * 1024


def test_flop_formulas():
    # A weight used once per token costs one multiply-add, so these layers cost 2 x their parameters.
    for kind, args in [("lowrank", {}), ("monarch", {}), ("btt", {}), ("btt", {"cores": 3, "rank": 2})]:
        assert layer_flops(build(kind, 256, 1024, **args)) == 2 * expected_parameters(kind, 256, 1024, **args)
    # Kronecker reuses A and B: 256 = 16 x 16 and 1024 = 32 x 32, B first then A.
    assert layer_flops(build("kronecker", 256, 1024)) == 2 * (16 * 16 * 32 + 32 * 16 * 32)
    # btt-moe: the router, then k of the experts.
    moe, btt = build("btt-moe", 256, 1024, experts=4, experts_k=2), build("btt", 256, 1024)
    assert layer_flops(moe) == 2 * 4 * 256 + 2 * layer_flops(btt)


VALID = [
    ("dense", 7, 13, {}),
    ("lowrank", 64, 256, {"rank": 64}),
    ("kronecker", 7, 13, {}),
    ("monarch", 64, 256, {"blocks": 8}),
    ("monarch", 7, 13, {}),
    ("btt", 64, 256, {"cores": 3, "rank": 4, "blocks": 5, "experts": 0}),  # arguments a layer does not use are ignored
    ("btt-moe", 64, 256, {"experts": 2, "experts_k": 2, "rank": None}),  # None means the default
    ("btt-moe", 64, 256, {"experts": 1}),  # experts_k defaults to min(2, experts)
]
INVALID = [
    ("nope", 64, 256, {}, "'nope'"),
    ("dense", 0, 256, {}, "in_features=0"),
    ("lowrank", 64, 256, {"rank": 80}, "rank=80 exceeds min(in, out)=64"),
    ("lowrank", 64, 256, {"rank": 0}, "rank=0"),
    ("monarch", 64, 256, {"blocks": 5}, "monarch blocks=5 must divide in_features=64 and out_features=256"),
    ("monarch", 64, 256, {"blocks": 2.0}, "blocks=2.0"),
    ("btt", 64, 256, {"cores": 4}, "cores=4"),
    ("btt", 64, 256, {"rank": -1}, "rank=-1"),
    ("btt-moe", 64, 256, {"experts": 2, "experts_k": 3}, "experts_k=3 exceeds experts=2"),
    ("btt-moe", 64, 256, {"experts": 0}, "experts=0"),
    ("btt-moe", 64, 256, {"cores": 1}, "cores=1"),
]


@pytest.mark.parametrize("kind,in_features,out_features,args", VALID)
def test_valid_layers_have_no_problem(kind, in_features, out_features, args):
    assert linear_problem(kind, in_features, out_features, **args) is None
    build(kind, in_features, out_features, **args)


@pytest.mark.parametrize("kind,in_features,out_features,args,message", INVALID)
def test_invalid_layers_are_explained(kind, in_features, out_features, args, message):
    problem = linear_problem(kind, in_features, out_features, **args)
    assert problem is not None and message in problem
    if kind in LINEARS:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            build(kind, in_features, out_features, **args)


def test_kronecker_is_torch_kron():
    layer = build("kronecker", 24, 24)
    assert layer.A.shape == (4, 4) and layer.B.shape == (6, 6)  # 24 = 4 x 6, as square as it gets
    x = torch.randn(5, 24)
    torch.testing.assert_close(layer(x), x @ torch.kron(layer.A, layer.B).T)


def test_monarch_with_one_block_is_a_product_of_two_dense_matrices():
    layer = build("monarch", 16, 24, blocks=1)
    x = torch.randn(5, 16)
    torch.testing.assert_close(layer(x), x @ (layer.L[0] @ layer.R[0]).T)


def test_monarch_square_is_P_L_P_R_and_mixes_every_input():
    b, n = 4, 16
    layer = build("monarch", n, n, blocks=b)
    shuffle = torch.zeros(n, n)  # the perfect shuffle: reshape to (b, b) and transpose
    for i, j in itertools.product(range(b), range(b)):
        shuffle[i * b + j, j * b + i] = 1
    want = shuffle @ torch.block_diag(*layer.L) @ shuffle.T @ torch.block_diag(*layer.R)
    torch.testing.assert_close(layer.dense_weight(), want)
    x = torch.randn(5, n)
    torch.testing.assert_close(layer(x), x @ want.T)
    assert (want != 0).all()


def btt_entry(cores, n, m, i, j):
    """W[i, j] of a one-expert BTT, summed term by term from the index formula in linear_btt's docstring."""
    c, rank = len(cores), cores[0].shape[4]
    i_digits, j_digits = _digits(i, m), _digits(j, n)
    total = 0.0
    for inner in itertools.product(range(rank), repeat=c - 1):
        a = (0, *inner, 0)
        term = 1.0
        for t, core in enumerate(cores):
            J = _flat(j_digits[t + 1:], n[t + 1:])
            I = _flat(i_digits[:t], m[:t])
            term *= core[0, J, I, i_digits[t], a[t + 1], j_digits[t], a[t]].item()
        total += term
    return total


def _digits(index, sizes):
    return [index // math.prod(sizes[k + 1:]) % sizes[k] for k in range(len(sizes))]


def _flat(digits, sizes):
    return sum(d * math.prod(sizes[k + 1:]) for k, d in enumerate(digits))


@pytest.mark.parametrize("cores,in_features,out_features", [(2, 6, 4), (3, 8, 12)])
def test_btt_follows_its_index_formula(cores, in_features, out_features):
    from cramming.model.linear_btt import btt_dims

    layer = build("btt", in_features, out_features, cores=cores, rank=2)
    n, m = btt_dims(in_features, out_features, cores)
    stacked = [core.detach().unsqueeze(0) for core in layer.cores]
    want = torch.tensor([[btt_entry(stacked, n, m, i, j) for j in range(in_features)] for i in range(out_features)])
    torch.testing.assert_close(layer.dense_weight().detach(), want)


def test_btt_of_rank_one_is_monarch_up_to_digit_order():
    b = 4
    monarch, btt = build("monarch", b * b, b * b, blocks=b), build("btt", b * b, b * b, rank=1)
    with torch.no_grad():  # the cores are R and L, laid out alike
        btt.cores[0].copy_(monarch.R.reshape(btt.cores[0].shape))
        btt.cores[1].copy_(monarch.L.reshape(btt.cores[1].shape))
    reversed_digits = monarch.dense_weight().reshape(b, b, b, b).permute(1, 0, 3, 2).reshape(b * b, b * b)
    torch.testing.assert_close(btt.dense_weight(), reversed_digits)


def test_btt_moe_mixes_the_top_k_experts_per_token():
    layer = build("btt-moe", 12, 8, bias=True, experts=4, experts_k=2)
    x = torch.randn(6, 12)
    experts = layer.dense_weight()  # (experts, out, in)
    y = layer(x)
    for token in range(6):
        top, index = (layer.router @ x[token]).topk(2)
        weights = top.softmax(0)
        want = sum(w * experts[e] @ x[token] for w, e in zip(weights, index)) + layer.bias
        torch.testing.assert_close(y[token], want)
    gates = layer.gates(x)
    assert ((gates > 0).sum(-1) == 2).all()
    torch.testing.assert_close(gates.sum(-1), torch.ones(6))


def layer_flops(layer) -> int:
    """Forward FLOPs per token of one linear layer, by training's counter (cramming/train/flops.py)."""
    return counter(layer)(layer)
