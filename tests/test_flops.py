"""FLOPs per token: the closed form for a dense model, and structured layers counting their own."""

import pytest

from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM
from cramming.train.flops import forward_flops_per_token

TINY = dict(vocab_size=100, hidden_size=32, num_layers=3, num_heads=4, ffn_size=128, ffn="mlp")


def test_dense_count_is_the_textbook_formula():
    model = CrammedForMaskedLM(CrammedConfig(**TINY))
    h, f, layers, seq = 32, 128, 3, 20
    per_layer = 2 * (h * 3 * h + h * h + h * f + f * h) + 4 * seq * h
    assert forward_flops_per_token(model, seq, 0.25) == layers * per_layer + int(2 * h * 100 * 0.25)
    causal = CrammedForCausalLM(CrammedConfig(**TINY, objective="clm"))
    assert forward_flops_per_token(causal, seq) == layers * (per_layer - 2 * seq * h) + 2 * h * 100


@pytest.mark.parametrize("kind", ["lowrank", "kronecker", "monarch", "btt", "btt-moe"])
def test_structured_layers_cost_less_than_dense(kind):
    dense = forward_flops_per_token(CrammedForMaskedLM(CrammedConfig(**TINY)), 16)
    structured = CrammedForMaskedLM(CrammedConfig(**TINY, linear=kind, linear_on=["ffn"]))
    assert forward_flops_per_token(structured, 16) < dense
