"""The layer stack is chosen when the model is built (modeling_crammed.build_stack): every block in turn (None), a
U-net (model/unet.py) or token dropping (model/token_dropping.py). The forward runs whichever stack the options
asked for, and the stack holds only structure, so the model's tensor names do not depend on it."""

import pytest
import torch

from cramming.model import CrammedConfig, CrammedForMaskedLM
from cramming.model.token_dropping import DroppingStack
from cramming.model.unet import UNetStack

SIZES = {"hidden_size": 32, "num_heads": 4, "ffn_size": 64, "num_layers": 4, "vocab_size": 97}


def model(**options) -> CrammedForMaskedLM:
    torch.manual_seed(0)
    return CrammedForMaskedLM(CrammedConfig(**SIZES, **options))


@pytest.mark.parametrize("options, kind", [
    (dict(), type(None)),  # every block in turn: CrammedModel.run_blocks
    (dict(unet_skips=True), UNetStack),
    (dict(token_dropping={"keep": 0.5}), DroppingStack),
    (dict(token_dropping={"keep": 1.0}), type(None)),  # keeping every token drops none
])
def test_the_options_choose_the_stack_when_the_model_is_built(options, kind):
    assert type(model(**options).encoder.stack) is kind


def test_the_dropping_stack_keeps_its_layers_and_cross_attention_choice():
    stack = model(token_dropping={"keep": 0.5, "layers": [1, 3], "cross_first": False}).encoder.stack
    assert (stack.dropping, stack.cross_first) == (range(1, 3), False)


def test_the_stack_adds_no_tensors():
    """Stacks hold no weights: the U-net's live in model.unet, so checkpoints keep their names."""
    assert not any("stack" in name for name in model(unet_skips=True).state_dict())
    assert "encoder.unet.weights" in model(unet_skips=True).state_dict()


def test_each_stack_computes_what_its_options_mean():
    """The U-net stack feeds the skips (a zero skip weight is the plain stack); the dropping stack runs every token
    when the forward keeps all (validation), and only the kept ones in training."""
    ids = torch.randint(5, 97, (2, 12))
    plain = model().eval()
    unet = model(unet_skips=True).eval()
    unet.load_state_dict(plain.state_dict(), strict=False)
    assert not torch.allclose(unet(ids).logits, plain(ids).logits)  # the skips start at weight 1
    with torch.no_grad():
        unet.encoder.unet.weights.zero_()
    torch.testing.assert_close(unet(ids).logits, plain(ids).logits, rtol=0, atol=0)

    dropping = model(token_dropping={"keep": 0.5})
    dropping.load_state_dict(plain.state_dict(), strict=False)
    dropping.eval()
    torch.testing.assert_close(dropping(ids).logits, plain(ids).logits, rtol=0, atol=0)
    keep = torch.arange(0, 12, 2).expand(2, -1)
    dropped = dropping.encoder(ids, keep=keep).last_hidden_state
    whole = dropping.encoder(ids).last_hidden_state
    assert not torch.allclose(dropped, whole)
