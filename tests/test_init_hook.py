"""Each module of the model initialises its own weights through one hook, `init_weights_(init, std)`: the model's
_init_weights only handles torch's plain layers and calls the hook. Moving the init there (issue 27) changed no
weight: every arch preset and a spread of options build, at seed 0, the tensors hashed in
tests/fixtures/init_hashes.json, written by tests/init_hashes.py on the code before the move."""

import json

import pytest
import torch
from init_hashes import CASES, FIXTURE, hashes
from torch import nn

RENAMED = {".rpe.": ".score_bias."}  # issue 27: the score-bias slot's new name (old checkpoints still load)


def renamed(key: str) -> str:
    for old, new in RENAMED.items():
        key = key.replace(old, new)
    return key


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_architecture_starts_from_the_same_weights_as_before(case):
    before = {renamed(k): v for k, v in json.loads(FIXTURE.read_text())[case].items()}
    assert hashes(CASES[case]) == before


def test_a_module_of_its_own_is_initialised_through_the_hook():
    """A module the model has never heard of gets the hook called with its std, and a reinit redraws it."""
    from cramming.model import CrammedConfig, CrammedForMaskedLM

    class Gain(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Parameter(torch.zeros(3))

        def init_weights_(self, init, std):
            init.constant_(self.g, std)

    model = CrammedForMaskedLM(CrammedConfig(num_layers=1, hidden_size=16, num_heads=2, ffn_size=32, vocab_size=32,
                                             init_std=0.125))
    model.gain = Gain()
    model._init_weights(model.gain)
    assert torch.equal(model.gain.g, torch.full((3,), 0.125))
