"""impl.activation_checkpointing: the same loss and gradients to rounding, far fewer activations held for the
backward pass, and the option reaches the model that pretraining trains."""

import pytest
import torch
from test_resume import TINY, config_for

from cramming.engines import Engine
from cramming.impl import Runtime
from cramming.model import CrammedConfig
from cramming.model.electra import CrammedForReplacedTokenDetection
from cramming.model.modeling_crammed import CrammedForMaskedLM
from cramming.run import build_model, place
from cramming.train.recompute import recompute_blocks


def tiny_mlm(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    config = CrammedConfig(hidden_size=64, num_heads=4, ffn_size=128, num_layers=3, vocab_size=100,
                           hidden_dropout=dropout, attention_dropout=dropout)
    return CrammedForMaskedLM(config)


def loss_grads_and_saved_bytes(model, ids, labels):
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    torch.manual_seed(1)  # the same dropout draws for both models
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, sum(saved)


def test_the_same_loss_and_gradients_with_far_less_held():
    ids = torch.randint(5, 100, (4, 32), generator=torch.Generator().manual_seed(0))
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.25, ids, -100)
    plain, checkpointed = tiny_mlm(), tiny_mlm()
    assert recompute_blocks(checkpointed) == 3
    loss_a, grads_a, held_a = loss_grads_and_saved_bytes(plain, ids, labels)
    loss_b, grads_b, held_b = loss_grads_and_saved_bytes(checkpointed, ids, labels)
    torch.testing.assert_close(loss_b, loss_a)  # dropout on: the replayed random state draws the same masks
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5, atol=1e-6)
    assert held_b < 0.5 * held_a  # only each block's input, not its attention and FFN intermediates
    assert checkpointed.state_dict().keys() == plain.state_dict().keys()


def test_every_encoder_is_covered_once():
    config = CrammedConfig(objective="rtd", hidden_size=32, num_heads=4, ffn_size=64, num_layers=2, vocab_size=50)
    model = CrammedForReplacedTokenDetection(config)
    assert recompute_blocks(model) == 2 + 2  # the discriminator's blocks and the generator's
    assert recompute_blocks(model) == 0  # not wrapped twice


@pytest.mark.parametrize("on", [True, False])
def test_the_option_reaches_the_trained_model(on):
    config = config_for(*TINY, f"impl.activation_checkpointing={str(on).lower()}")
    runtime = Runtime(torch.device("cpu"), "fp32", False)
    model = build_model(config.arch, 64, {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}, runtime)
    model, _, _, _ = place(config, model, runtime, Engine())
    assert all(block.gradient_checkpointing == on for block in model.encoder.layers)
