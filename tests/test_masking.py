"""MLM masking: a fixed count per row, never special tokens, 80/10/10."""

import torch

from cramming.train.masking import mask_tokens

SPECIAL = torch.tensor([0, 2, 3, 4])


def batch(rows=64, seq=128, vocab=1000):
    ids = torch.randint(5, vocab, (rows, seq), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 2  # [CLS]
    ids[:, 50] = 3  # [SEP] between documents
    return ids


def test_fixed_count_and_labels():
    ids = batch()
    inputs, labels = mask_tokens(ids, 0.25, 4, 1000, SPECIAL, generator=torch.Generator().manual_seed(1))
    chosen = labels != -100
    assert (chosen.sum(1) == 32).all()  # round(0.25 * 128) in every row
    assert (labels[chosen] == ids[chosen]).all()
    assert not chosen[:, 0].any() and not chosen[:, 50].any()  # special tokens never masked
    assert (inputs[~chosen] == ids[~chosen]).all()  # unmasked positions untouched


def test_replacement_shares():
    ids = batch(rows=512)
    inputs, labels = mask_tokens(ids, 0.25, 4, 1000, SPECIAL, 0.8, torch.Generator().manual_seed(2))
    chosen = labels != -100
    total = chosen.sum().item()
    as_mask = (inputs[chosen] == 4).sum().item() / total
    unchanged = (inputs[chosen] == ids[chosen]).sum().item() / total
    assert abs(as_mask - 0.8) < 0.02
    assert abs(unchanged - 0.1) < 0.02  # plus the rare random draw equal to the original
    assert abs(1 - as_mask - unchanged - 0.1) < 0.02


def test_deterministic_with_generator():
    ids = batch()
    a = mask_tokens(ids, 0.25, 4, 1000, SPECIAL, generator=torch.Generator().manual_seed(3))
    b = mask_tokens(ids, 0.25, 4, 1000, SPECIAL, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
