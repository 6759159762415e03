"""The fused vocabulary projection + cross-entropy gives the plain path's loss and gradients, in every model that
uses it, across chunk boundaries, with and without bias and ignored rows, and under bf16 autocast."""

import pytest
import torch
import torch.nn.functional as F

from cramming import kernels
from cramming.kernels import fused_loss
from cramming.kernels.fused_loss import linear_cross_entropy
from cramming.model import CrammedConfig, CrammedForCausalLM, CrammedForMaskedLM

kernels.register()  # loss_impl=fused, as impl.py registers it for a run

TINY = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, ffn_size=64, max_seq_length=16)


def loss_and_grads(fused: bool, bias: bool, targets, autocast=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(targets), 24, generator=g).requires_grad_()
    weight = (torch.randn(53, 24, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(53, generator=g) * 0.1).requires_grad_() if bias else None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if fused:
            loss = linear_cross_entropy(hidden, weight, b, targets)
        else:
            loss = F.cross_entropy(F.linear(hidden, weight, b).float(), targets, ignore_index=-100)
    (loss * 0.25).backward()  # a scaled loss, as gradient accumulation does
    return [loss, hidden.grad, weight.grad] + ([b.grad] if bias else [])


@pytest.mark.parametrize("bias", [True, False])
def test_fused_equals_plain_across_chunks(bias, monkeypatch):
    monkeypatch.setattr(fused_loss, "CHUNK_ELEMENTS", 53 * 4)  # 4 rows per chunk: 10 rows span 3 chunks
    targets = torch.tensor([3, -100, 7, 52, 0, -100, 11, 11, 40, 2])
    plain, fused = loss_and_grads(False, bias, targets), loss_and_grads(True, bias, targets)
    for want, got in zip(plain, fused):
        assert got.dtype == want.dtype and torch.allclose(got, want, rtol=1e-5, atol=1e-7)
    assert fused[1][1].abs().sum() == 0 and fused[1][5].abs().sum() == 0  # ignored rows get no gradient


def test_no_rows_to_predict_is_a_zero_loss_with_zero_gradients():
    """A microbatch whose masks hit nothing (sparse MLM) contributes nothing, where the plain path gives NaN."""
    loss, hidden_grad, weight_grad, bias_grad = loss_and_grads(True, True, torch.tensor([], dtype=torch.long))
    assert loss.item() == 0 and hidden_grad.numel() == 0
    assert not weight_grad.any() and not bias_grad.any()


def test_fused_under_bf16_autocast_matches_plain_to_bf16_precision():
    targets = torch.tensor([3, -100, 7, 52, 0, 9, 11, 11])
    plain, fused = loss_and_grads(False, True, targets, autocast=True), loss_and_grads(True, True, targets, autocast=True)
    for want, got in zip(plain, fused):
        assert got.dtype == want.dtype  # the loss in fp32, gradients in the parameters' dtype
        assert torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-3 * want.abs().max().item())


@pytest.mark.parametrize("model_class, extra", [
    (CrammedForMaskedLM, dict(sparse_prediction=True)),
    (CrammedForMaskedLM, dict(sparse_prediction=False, head_transform=True)),
    (CrammedForCausalLM, dict(objective="clm")),
])
def test_models_train_the_same_with_the_fused_loss(model_class, extra):
    torch.manual_seed(0)
    plain = model_class(CrammedConfig(**TINY, **extra, hidden_dropout=0.0, attention_dropout=0.0))
    fused = model_class(CrammedConfig(**TINY, **extra, hidden_dropout=0.0, attention_dropout=0.0, loss_impl="fused"))
    fused.load_state_dict(plain.state_dict())
    ids = torch.randint(5, 97, (3, 16), generator=torch.Generator().manual_seed(1))
    labels = ids.clone() if extra.get("objective") == "clm" else torch.where(ids % 3 == 0, ids, -100)
    out = {}
    for name, model in (("plain", plain), ("fused", fused)):
        model.train()
        result = model(input_ids=ids, labels=labels)
        result.loss.backward()
        out[name] = result
    assert out["fused"].logits is None  # training never builds the full logits
    assert out["fused"].loss.item() == pytest.approx(out["plain"].loss.item(), rel=1e-6)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):  # the tied decoder included
        assert torch.allclose(q.grad, p.grad, rtol=1e-4, atol=1e-6), name
    fused.eval()  # evaluation wants the logits: the plain path
    with torch.no_grad():
        assert fused(input_ids=ids, labels=labels).logits is not None


@pytest.mark.parametrize("impl", ["plain", "fused"])
def test_per_token_is_the_mean_over_the_predicted_rows_and_each_rows_own_loss(impl):
    """What token dropping trains on (a dense head, arch.sparse_prediction=false, sees ignored rows too): the loss
    is the mean over the rows with a target, as F.cross_entropy's ignore_index takes it, and each row's own
    loss is 0 where its target is -100."""
    from cramming.model.losses import LOSSES

    torch.manual_seed(0)
    hidden, decoder = torch.randn(10, 24), torch.nn.Linear(24, 53)
    targets = torch.tensor([3, -100, 7, 52, 0, -100, 11, 11, 40, 2])
    loss, _, rows = LOSSES[impl].per_token(hidden, decoder, targets, training=True)
    logits = decoder(hidden).float()
    torch.testing.assert_close(loss, F.cross_entropy(logits, targets, ignore_index=-100))
    torch.testing.assert_close(rows, F.cross_entropy(logits, targets, ignore_index=-100, reduction="none"))
