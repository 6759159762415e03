"""cramming.run: build_run gives the parts pretrain() trains with, and Run.step is one checked optimizer step."""

import copy
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from cramming import pretraining
from cramming import run as run_module
from cramming.model import CrammedForCausalLM, CrammedForMaskedLM
from cramming.run import build_run, count_parameters, flops_per_token
from cramming.validation import load_config

REPO = Path(__file__).resolve().parents[1]
TINY = ["impl=cpu", "train=cpu-smoke", "data.vocab_size=128", "data.seq_length=16", "arch.num_layers=1",
        "arch.hidden_size=32", "arch.num_heads=2", "arch.ffn_size=64"]


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=[*TINY, *overrides]))


def batch(seed: int = 0) -> torch.Tensor:
    return torch.randint(5, 128, (4, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch,head", [("crammed-bert-tiny", CrammedForMaskedLM), ("gpt-tiny", CrammedForCausalLM)])
def test_build_run_builds_what_the_config_names(arch, head):
    config = config_for(f"arch={arch}")
    run = build_run(config)
    assert type(run.model) is head and run.step_model is run.model  # no compile on CPU
    assert run.parameters == count_parameters(run.model) and run.flops == flops_per_token(run.model, config)
    assert run.optimizer.param_groups[0]["params"][0] is next(run.model.parameters())
    assert run.objective.head is head  # the objective pretrain() trains this model with


@pytest.mark.parametrize("call", ["step", "update"])
def test_a_step_is_the_objective_forward_backward_clip_and_update(call):
    """The step a benchmark times is the trainer's: the objective's inputs, the loss, its gradients clipped at
    train.grad_clip (set tiny here so the clip binds) and the optimizer's update. Run.update is the same step on
    inputs made before (a benchmark masks outside its clock)."""
    config = config_for("arch=crammed-bert-tiny", "train.grad_clip=0.001")
    torch.manual_seed(0)
    run = build_run(config)
    torch.manual_seed(0)
    by_hand = build_run(config)
    ids = batch()
    if call == "step":
        loss = run.step(ids, torch.Generator().manual_seed(1))
    else:
        loss = run.update(run.objective.batch(ids, torch.Generator().manual_seed(1)))

    inputs = by_hand.objective.batch(ids, torch.Generator().manual_seed(1))
    expected = by_hand.model(**inputs).loss
    expected.backward()
    torch.nn.utils.clip_grad_norm_(by_hand.model.parameters(), 0.001)
    by_hand.optimizer.step()
    assert loss.item() == expected.item()
    for (name, got), want in zip(run.model.state_dict().items(), by_hand.model.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    assert all(p.grad is None for p in run.model.parameters())  # ready for the next step


def test_steps_lower_the_loss_on_a_repeated_batch():
    run = build_run(config_for("arch=gpt-tiny", "train.lr=0.01"))
    ids = batch()
    losses = [run.step(ids, torch.Generator().manual_seed(0)).item() for _ in range(8)]
    assert losses[-1] < losses[0] - 0.5, losses


def test_a_step_with_a_non_finite_loss_changes_no_weight():
    run = build_run(config_for("arch=crammed-bert-tiny"))
    with torch.no_grad():
        run.model.encoder.tokens.weight[7].fill_(float("nan"))
    before = copy.deepcopy(run.model.state_dict())
    assert not torch.isfinite(run.step(torch.full((4, 16), 7), torch.Generator().manual_seed(0)))
    for name, value in run.model.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0, equal_nan=True, msg=name)


def test_pretrain_builds_its_run_with_build_run(tmp_path, monkeypatch):
    built, real = [], run_module.build_run
    monkeypatch.setattr(pretraining, "build_run", lambda *args, **kwargs: built.append(real(*args, **kwargs)) or built[-1])
    summary = pretraining.pretrain(config_for("arch=crammed-bert-tiny", "data=sanity", "train.max_steps=1",
                                              f"data.cache_dir={tmp_path / 'cache'}"), tmp_path / "run")
    assert len(built) == 1 and summary["parameters"] == built[0].parameters


def test_the_benchmarks_train_ours_through_build_run():
    """No script builds our optimizer by hand; the sections that time our training steps take them from Run."""
    for path in sorted((REPO / "scripts").rglob("*.py")):
        assert "build_optimizer" not in path.read_text(encoding="utf-8"), path
    for name in ("train", "gpu", "documents", "token_dropping"):
        text = (REPO / "scripts" / "bench_sections" / f"{name}.py").read_text(encoding="utf-8")
        assert "build_run(config)" in text and "run.step(" in text.replace('side["run"].step(', "run.step("), name
