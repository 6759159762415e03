"""The layer stack is chosen when the model is built (blocks.build_stack): every block in turn (None), a
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


def test_a_new_stack_is_one_registered_class_whose_weights_the_model_holds():
    """The extension point itself (blocks.STACKS): a stack chosen by its own rule, its module held by the model
    under the name it gives (saved with the weights), its order of blocks the one the forward runs."""
    from torch import nn

    from cramming.model.blocks import STACKS, Stack

    class Reversed(Stack):
        """The blocks last to first, then a learned scale."""

        @staticmethod
        def chosen(config) -> bool:
            return config.num_layers == 3

        @staticmethod
        def weights(config) -> dict:
            return {"reversed_scale": nn.Linear(1, 1, bias=False)}

        def __call__(self, model, x, ctx, at, keep=None):
            x = model.run_blocks(x, range(len(model.layers) - 1, -1, -1), at)
            return x * model.reversed_scale.weight[0, 0]

    STACKS.register("reversed")(Reversed)
    try:
        torch.manual_seed(0)
        m = CrammedForMaskedLM(CrammedConfig(**{**SIZES, "num_layers": 3})).eval()
        assert type(m.encoder.stack) is Reversed and "encoder.reversed_scale.weight" in m.state_dict()
        ids = torch.randint(5, 97, (2, 12))
        with torch.no_grad():
            m.encoder.reversed_scale.weight.fill_(2.0)
            x = m.encoder.embed(ids, 0, None)
            for layer in reversed(m.encoder.layers):
                x = layer(x)
            want = m.encoder.final_norm(2.0 * x)
        torch.testing.assert_close(m.encoder(ids).last_hidden_state, want, rtol=0, atol=1e-6)
        assert type(model().encoder.stack) is type(None)  # four layers: not chosen
    finally:
        del STACKS["reversed"]
