"""FLOPs per token: exact counts from the dimensions for every block kind, and structured layers counting their own."""

import pytest

from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM
from cramming.train.flops import forward_flops_per_token

TINY = dict(vocab_size=100, hidden_size=32, num_layers=3, num_heads=4, ffn_size=128, ffn="mlp")
H, F, SEQ, VOCAB = 32, 128, 20, 100
ATTENTION = 2 * (H * 3 * H + H * H + H * F + F * H) + 4 * SEQ * H  # qkv, out, up, down; scores + weighted sum
GMLP = 2 * (H * F + F // 2 * H) + 2 * SEQ * (F // 2)  # up, down; the spatial matrix over the gate's half
TINY_ATTENTION = 2 * (H * 3 * 16 + 16 * F // 2) + 4 * SEQ * 16  # aMLP, gmlp_attn_dim=16: its qkv, out, one head


def test_dense_count_is_the_textbook_formula():
    model = CrammedForMaskedLM(CrammedConfig(**TINY))
    assert forward_flops_per_token(model, SEQ, 0.25) == 3 * ATTENTION + int(2 * H * VOCAB * 0.25)
    causal = CrammedForCausalLM(CrammedConfig(**TINY, objective="clm"))
    assert forward_flops_per_token(causal, SEQ) == 3 * (ATTENTION - 2 * SEQ * H) + 2 * H * VOCAB


def test_gmlp_counts_its_spatial_gate_and_no_attention():
    model = CrammedForMaskedLM(CrammedConfig(**TINY, layout="gmlp"))
    assert forward_flops_per_token(model, SEQ, 0.25) == 3 * GMLP + int(2 * H * VOCAB * 0.25)
    # the causal lower triangle is applied as a full (masked) matrix: the same count
    causal = CrammedForCausalLM(CrammedConfig(**TINY, layout="gmlp", objective="clm"))
    assert forward_flops_per_token(causal, SEQ) == 3 * GMLP + 2 * H * VOCAB


def test_amlp_adds_its_tiny_attention():
    model = CrammedForMaskedLM(CrammedConfig(**TINY, layout="gmlp", gmlp_attn_dim=16))
    assert forward_flops_per_token(model, SEQ) == 3 * (GMLP + TINY_ATTENTION) + 2 * H * VOCAB
    causal = CrammedForCausalLM(CrammedConfig(**TINY, layout="gmlp", gmlp_attn_dim=16, objective="clm"))
    assert forward_flops_per_token(causal, SEQ) == 3 * (GMLP + TINY_ATTENTION - 2 * SEQ * 16) + 2 * H * VOCAB


def test_a_mixed_layout_counts_each_block_as_its_kind():
    model = CrammedForMaskedLM(CrammedConfig(**TINY, layout=["attention", "gmlp"]))  # attention, gmlp, attention
    assert forward_flops_per_token(model, SEQ) == 2 * ATTENTION + GMLP + 2 * H * VOCAB


@pytest.mark.parametrize("kind", ["lowrank", "kronecker", "monarch", "btt", "btt-moe"])
def test_structured_layers_cost_less_than_dense(kind):
    dense = forward_flops_per_token(CrammedForMaskedLM(CrammedConfig(**TINY)), 16)
    structured = CrammedForMaskedLM(CrammedConfig(**TINY, linear=kind, linear_on=["ffn"]))
    assert forward_flops_per_token(structured, 16) < dense


def test_a_block_of_your_own_is_counted_by_the_counter_it_adds():
    """The counters are training's (FLOPS, by class): a block kind without one is one error naming it and where
    its counter goes; with one added, the model counts it."""
    import torch

    from cramming.model.modeling_crammed import TransformerBlock
    from cramming.train.flops import FLOPS, block_flops

    class Shortcut(torch.nn.Module):
        def forward(self, x, ctx=None):
            return x

    model = CrammedForMaskedLM(CrammedConfig(**TINY))
    model.encoder.layers[1] = Shortcut()
    with pytest.raises(ValueError, match=r"no FLOPs counter for Shortcut: add one to cramming.train.flops.FLOPS"):
        forward_flops_per_token(model, SEQ)
    FLOPS[Shortcut] = lambda block, seq_len: 7 * seq_len
    try:
        assert forward_flops_per_token(model, SEQ) == 2 * ATTENTION + 7 * SEQ + 2 * H * VOCAB
    finally:
        del FLOPS[Shortcut]
    assert block_flops(model.encoder.layers[0], SEQ) == ATTENTION and isinstance(model.encoder.layers[0],
                                                                                  TransformerBlock)
