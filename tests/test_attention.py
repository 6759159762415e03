"""Attention semantics shared by every kernel: padding, causal, local windows, ALiBi, fully masked queries."""

import math

import pytest
import torch

from cramming.model.attention import ATTENTION_KERNELS, alibi_slopes, eager_attention, sdpa_attention, visible_keys
from cramming.model.attention_masks import AttentionSpec

OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window=2),
    dict(window=2, causal=True),
    dict(alibi=True),
    dict(alibi=True, causal=True, window=3),
]


def qkv(batch=2, heads=3, seq=9, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, dim, generator=g) for _ in range(3)]


def padding(batch=2, seq=9):
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[1, 5:] = False
    return mask


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_matches_the_eager_reference(options, padded):
    q, k, v = qkv()
    mask = padding() if padded else None
    spec = AttentionSpec(padding=mask, **options)
    torch.testing.assert_close(sdpa_attention(q, k, v, spec), eager_attention(q, k, v, spec), atol=1e-5, rtol=1e-5)


def test_eager_is_the_textbook_formula():
    q, k, v = qkv(batch=1, heads=1, seq=4, dim=2)
    scores = q[0, 0] @ k[0, 0].T / math.sqrt(2)
    scores = scores - torch.tensor(alibi_slopes(1))[0] * (torch.arange(4)[:, None] - torch.arange(4)).abs()
    scores = scores.masked_fill(torch.ones(4, 4).tril() == 0, float("-inf"))
    want = torch.softmax(scores, -1) @ v[0, 0]
    torch.testing.assert_close(eager_attention(q, k, v, AttentionSpec(causal=True, alibi=True))[0, 0], want)


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    # 6 heads: the 4-head slopes, then every other slope of the 8-head series.
    assert alibi_slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


@pytest.mark.parametrize("causal", [False, True])
def test_local_window_ignores_far_tokens(causal):
    q, k, v = qkv(batch=1, heads=2, seq=12)
    out = eager_attention(q, k, v, AttentionSpec(causal=causal, window=2))
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :3] += 5.0  # change keys 0..2: only queries 0..4 (window 2) may notice
    v2[:, :, :3] -= 5.0
    out2 = eager_attention(q, k2, v2, AttentionSpec(causal=causal, window=2))
    assert torch.equal(out[:, :, 5:], out2[:, :, 5:])
    assert not torch.allclose(out[:, :, :5], out2[:, :, :5])


def test_a_window_as_long_as_the_sequence_is_global_attention():
    q, k, v = qkv()
    torch.testing.assert_close(eager_attention(q, k, v, AttentionSpec(window=8)), eager_attention(q, k, v))


@pytest.mark.parametrize("name", sorted(set(ATTENTION_KERNELS) - {"triton"}))
def test_a_query_that_sees_nothing_gets_zeros(name):
    q, k, v = qkv(batch=1, seq=8)
    mask = torch.zeros(1, 8, dtype=torch.bool)
    mask[0, :2] = True  # with window 2, queries 5..7 see only padding
    for t in (q, k, v):
        t.requires_grad_(True)
    out = ATTENTION_KERNELS[name](q, k, v, AttentionSpec(padding=mask, window=2))
    assert torch.equal(out[:, :, 5:], torch.zeros_like(out[:, :, 5:]))
    out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_visible_keys_is_none_without_restrictions():
    assert visible_keys(5, False, None, None, "cpu") is None
    assert visible_keys(5, True, None, None, "cpu")[0, 0].equal(torch.ones(5, 5, dtype=torch.bool).tril())


def test_stepped_pattern_sees_its_block_and_the_previous_one():
    visible = visible_keys(8, False, None, None, "cpu", stepped=2)[0, 0]
    want = torch.tensor([[abs(q // 2 - k // 2) <= 1 and q // 2 >= k // 2 for k in range(8)] for q in range(8)])
    assert torch.equal(visible, want)
    assert visible[5].nonzero().flatten().tolist() == [2, 3, 4, 5]  # block 2 sees blocks 1 and 2
    causal = visible_keys(8, True, None, None, "cpu", stepped=2)[0, 0]
    assert causal[5].nonzero().flatten().tolist() == [2, 3, 4, 5] and causal[4].nonzero().flatten().tolist() == [2, 3, 4]


def test_topk_with_k_equal_to_the_sequence_is_dense_and_smaller_k_differs():
    q, k, v = qkv()
    torch.testing.assert_close(eager_attention(q, k, v, AttentionSpec(topk=9)), eager_attention(q, k, v))
    assert not torch.allclose(eager_attention(q, k, v, AttentionSpec(topk=2)), eager_attention(q, k, v))


def test_topk_keeps_exactly_the_k_largest_scores():
    q, k, v = qkv(batch=1, heads=1, seq=6)
    v = torch.eye(6)[None, None]  # output row = the attention probabilities
    probs = eager_attention(q, k, v, AttentionSpec(topk=2))[0, 0]
    scores = q[0, 0] @ k[0, 0].T
    assert torch.equal(probs > 0, scores >= scores.topk(2, dim=-1).values[:, -1:])


def test_sdpa_refuses_topk_and_matches_eager_for_stepped_and_a_bias():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="top-k"):
        sdpa_attention(q, k, v, AttentionSpec(topk=3))
    bias = torch.randn(1, 3, 9, 9)
    mask = padding()
    torch.testing.assert_close(sdpa_attention(q, k, v, AttentionSpec(padding=mask, stepped=3, bias=bias)),
                               eager_attention(q, k, v, AttentionSpec(padding=mask, stepped=3, bias=bias)),
                               atol=1e-5, rtol=1e-5)
