"""MLM masking: a fixed count per row, never special tokens, 80/10/10."""

import pytest
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


def test_validation_masks_do_not_depend_on_the_microbatch(tmp_path):
    """The same untrained model scored with microbatch 4 and 8: the same masked tokens, so the same loss."""
    import contextlib

    from cramming.config import ArchConfig, DataConfig, TrainConfig
    from cramming.data.prepare import prepare_data
    from cramming.impl import Runtime
    from cramming.run import build_model
    from cramming.train.heldout import heldout_metrics
    from cramming.train.objectives import build_objective

    folder, meta = prepare_data(DataConfig(source="sanity", vocab_size=256, seq_length=32, max_chars=100_000,
                                           validation_fraction=0.1, cache_dir=str(tmp_path)))
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    arch = ArchConfig(num_layers=1, hidden_size=32, num_heads=2, ffn_size=64, max_seq_length=32)
    model = build_model(arch, meta["vocab_size"], meta["special_ids"], Runtime(cpu, "fp32", False, "sdpa", "torch"))
    cfg = TrainConfig(validation_sequences=24)
    objective = build_objective("mlm", cfg, meta, cpu)
    scores = [heldout_metrics(model, objective, folder, meta, cfg, micro, cpu, contextlib.nullcontext)
              for micro in (4, 8, 24)]
    assert scores[0]["val_predicted_tokens"] == scores[1]["val_predicted_tokens"] == 24 * 8  # round(0.25 * 32)
    for other in scores[1:]:
        assert other["val_loss"] == pytest.approx(scores[0]["val_loss"], rel=1e-6, abs=0)
        assert other["val_accuracy"] == scores[0]["val_accuracy"]


def test_the_heldout_accuracy_is_the_share_of_masked_tokens_right_and_the_loss_their_mean(tmp_path):
    """val_accuracy counts each masked token once over the whole split, val_loss weighs each batch's mean loss by
    its masked tokens. Scored with an oracle (every masked token right) whose loss is its batch's size: batches of
    5, 5, 5, 5 and 4 rows of 8 masked tokens give (4 x 5 x 40 + 4 x 32) / 192."""
    import contextlib
    from types import SimpleNamespace

    from cramming.config import DataConfig, TrainConfig
    from cramming.data.prepare import prepare_data
    from cramming.train.heldout import heldout_metrics
    from cramming.train.objectives import build_objective

    folder, meta = prepare_data(DataConfig(source="sanity", vocab_size=256, seq_length=32, max_chars=100_000,
                                           validation_fraction=0.1, cache_dir=str(tmp_path)))

    class Oracle(torch.nn.Module):
        def forward(self, input_ids, labels, **_):
            logits = torch.nn.functional.one_hot(labels.clamp(min=0), meta["vocab_size"]).float()
            return SimpleNamespace(logits=logits, loss=torch.tensor(float(len(input_ids))))

    cfg = TrainConfig(validation_sequences=24)
    objective = build_objective("mlm", cfg, meta, torch.device("cpu"))
    scores = heldout_metrics(Oracle(), objective, folder, meta, cfg, 5, torch.device("cpu"), contextlib.nullcontext)
    assert scores["val_predicted_tokens"] == 24 * 8 and scores["val_accuracy"] == 1.0
    assert scores["val_loss"] == pytest.approx((4 * 5 * 40 + 4 * 32) / 192)
