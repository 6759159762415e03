"""Optimizers: each one learns, carries base_lr, resumes bitwise from its state_dict, and runs under GradScaler."""

import io

import pytest
import torch

from cramming.config import OptimConfig, SGDConfig, TrainConfig
from cramming.errors import UserError
from cramming.model import CrammedConfig, CrammedForMaskedLM
from cramming.train.lion import Lion
from cramming.train.optim import OPTIMIZERS, Combined, build_optimizer, optimizer_problem

CPU = torch.device("cpu")
LR = {"adamw": 3e-3, "lion": 3e-3, "muon": 3e-3, "sgd": 0.3}  # a peak each one learns with in 20 steps
needs_muon = pytest.mark.skipif(not hasattr(torch.optim, "Muon"), reason="torch.optim.Muon needs torch >= 2.9")
NAMES = [pytest.param(name, marks=needs_muon) if name == "muon" else name for name in sorted(OPTIMIZERS)]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tensors this small run fastest on one thread; two would spin-wait on each other on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(seed=0, **arch):
    torch.manual_seed(seed)
    arch = {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 4, "ffn_size": 64,
            "max_seq_length": 16, "hidden_dropout": 0.0, "attention_dropout": 0.0, **arch}
    return CrammedForMaskedLM(CrammedConfig(**arch))


def config(name):
    return TrainConfig(lr=LR[name], optim=OptimConfig(name=name))


BATCH = torch.randint(5, 97, (4, 16), generator=torch.Generator().manual_seed(1))


def train(model, optimizer, steps, scaler=None):
    scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
    losses = []
    for _ in range(steps):
        for group in optimizer.param_groups:  # as the trainer does
            group["lr"] = group["base_lr"] * 0.9
        loss = model(input_ids=BATCH, labels=BATCH).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", NAMES)
def test_every_optimizer_learns_and_carries_base_lr(name):
    model = tiny_model()
    optimizer = build_optimizer(model, config(name), CPU)
    assert all(group["base_lr"] > 0 for group in optimizer.param_groups)
    covered = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(covered) == len(set(covered)) == len(list(model.parameters()))
    for group in optimizer.param_groups:  # weight decay on matrices only
        assert group["weight_decay"] == (0.01 if all(p.ndim >= 2 for p in group["params"]) else 0.0)
    losses = train(model, optimizer, 20)
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_resumes_bitwise(name):
    model = tiny_model()
    optimizer = build_optimizer(model, config(name), CPU)
    train(model, optimizer, 3)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, saved)
    train(model, optimizer, 2)

    saved.seek(0)
    state = torch.load(saved)
    fresh = tiny_model(seed=1)
    fresh.load_state_dict(state["model"])
    resumed = build_optimizer(fresh, config(name), CPU)
    resumed.load_state_dict(state["optimizer"])
    train(fresh, resumed, 2)
    for (key, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), key
    # the parts of a combined optimizer read the loaded groups and state, not their own stale copies
    for part in getattr(resumed, "parts", ()):
        assert all(any(g is group for group in resumed.param_groups) for g in part.param_groups)
        assert part.state is resumed.state


@needs_muon
def test_muon_takes_exactly_the_block_matrices():
    model = tiny_model()
    optimizer = build_optimizer(model, config("muon"), CPU)
    assert isinstance(optimizer, Combined) and isinstance(optimizer, torch.optim.Optimizer)
    hidden, rest = optimizer.parts
    assert isinstance(hidden, torch.optim.Muon) and isinstance(rest, torch.optim.AdamW)
    on_muon = {name for name, p in model.named_parameters() if any(p is q for q in hidden.param_groups[0]["params"])}
    expected = {f"encoder.layers.{i}.{w}.weight" for i in (0, 1) for w in ("attn.qkv", "attn.out", "ffn.up", "ffn.down")}
    assert on_muon == expected  # not the embedding (tied to the decoder), the norms or the position scale
    assert hidden.param_groups[0]["base_lr"] == 0.02 and all(g["base_lr"] == LR["muon"] for g in rest.param_groups)

    # A random gradient, one step from zero momentum, no weight decay: the matrix moves by lr * sqrt(64 / 32) * O
    # with O near-orthogonal (Newton-Schulz leaves its singular values roughly in (0.7, 1.2)); Adam's first step,
    # about lr * sign(grad), would have singular values from near 0 to about 11.
    for group in optimizer.param_groups:
        group["lr"], group["weight_decay"] = group["base_lr"], 0.0
    weight = model.encoder.layers[0].ffn.up.weight
    before = weight.detach().clone()
    weight.grad = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    optimizer.step()
    singular = torch.linalg.svdvals((before - weight.detach()) / (0.02 * 2**0.5))
    assert singular.min() > 0.5 and singular.max() < 1.5, singular


@needs_muon
def test_muon_leaves_structured_factors_to_adamw():
    model = tiny_model(linear="monarch")  # 3-D block-diagonal factors: nothing 2-D in the blocks
    with pytest.raises(UserError, match="found no 2-D matrices"):
        build_optimizer(model, config("muon"), CPU)
    model = tiny_model(linear="lowrank", linear_on=["ffn"])  # 2-D factors in the FFN and dense attention
    hidden = build_optimizer(model, config("muon"), CPU).parts[0]
    assert len(hidden.param_groups[0]["params"]) == sum(p.ndim == 2 for p in model.encoder.layers.parameters())


@needs_muon
def test_combined_optimizer_under_an_active_grad_scaler():
    """A scaled step equals an unscaled one (the scale is a power of 2), and an inf gradient skips the step."""
    plain, scaled = tiny_model(), tiny_model()
    plain_opt, scaled_opt = build_optimizer(plain, config("muon"), CPU), build_optimizer(scaled, config("muon"), CPU)
    train(plain, plain_opt, 2)
    train(scaled, scaled_opt, 2, scaler=torch.amp.GradScaler("cpu", init_scale=2.0**10))
    for a, b in zip(plain.parameters(), scaled.parameters()):
        assert torch.equal(a, b)

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    before = [p.detach().clone() for p in scaled.parameters()]
    scaler.scale(scaled(input_ids=BATCH, labels=BATCH).loss).backward()
    scaled.encoder.layers[0].attn.out.weight.grad[0, 0] = float("inf")
    scaler.unscale_(scaled_opt)
    scaler.step(scaled_opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, scaled.parameters()))
    assert scaler.get_scale() == 2.0**9


def test_lion_moves_by_lr_times_the_sign_of_the_blend():
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = Lion([param], lr=0.1, betas=(0.9, 0.99), weight_decay=0.1)
    param.grad = torch.tensor([1.0, -1.0, 1.0])
    optimizer.step()  # momentum 0: the sign of the gradient
    expected = torch.tensor([1.0, -2.0, 3.0]) * (1 - 0.01) - 0.1 * torch.tensor([1.0, -1.0, 1.0])
    assert torch.allclose(param, expected)
    assert torch.allclose(optimizer.state[param]["exp_avg"], torch.tensor([0.01, -0.01, 0.01]))

    # The paper's rule: the update's sign is of beta1 * m + (1 - beta1) * g, the momentum then moves by beta2.
    # Blend 0.9 * m + 0.1 * g = [0.004, -0.109, -0.011]: its first sign is the momentum's, not the gradient's, and
    # its last the gradient's, where beta2's blend 0.99 * m + 0.01 * g (+0.0079) would keep the momentum's.
    param.grad = torch.tensor([-0.05, -1.0, -0.2])
    optimizer.step()
    expected = expected * (1 - 0.01) - 0.1 * torch.tensor([1.0, -1.0, -1.0])
    assert torch.allclose(param, expected)
    assert torch.allclose(optimizer.state[param]["exp_avg"], 0.99 * torch.tensor([0.01, -0.01, 0.01])
                          + 0.01 * torch.tensor([-0.05, -1.0, -0.2]))


def test_optimizer_problem_and_unknown_name():
    assert optimizer_problem("adamw") is None and optimizer_problem("sgd") is None
    assert "choose one of: adamw, lion, muon, sgd" in optimizer_problem("adam")
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        build_optimizer(tiny_model(), TrainConfig(optim=OptimConfig(name="adam")), CPU)


def test_finetuning_fused_adamw_takes_the_plain_adamw_steps():
    """eval's fine-tuning uses the fused AdamW (its for-loop twin was most of a CPU fine-tuning step): the same
    recipe gives the same weights, step by step, as the plain one."""
    from types import SimpleNamespace

    from cramming.eval.finetune import build_optimizer as finetune_optimizer

    recipe = SimpleNamespace(lr=4e-5, betas=[0.9, 0.98], eps=1e-6, weight_decay=0.01)
    models = [tiny_model(), tiny_model()]
    optimizers = [finetune_optimizer(models[0], recipe), finetune_optimizer(models[1], recipe, fused=False)]
    assert optimizers[0].defaults["fused"] and not optimizers[1].defaults["fused"]
    labels = BATCH.masked_fill(torch.rand(BATCH.shape, generator=torch.Generator().manual_seed(2)) > 0.3, -100)
    for _ in range(3):
        for model, optimizer in zip(models, optimizers):
            model(input_ids=BATCH, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    for fused, plain in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-7)


def test_sgd_without_momentum_is_plain_sgd_whatever_nesterov_says():
    """train.optim.sgd.momentum=0 is plain SGD (config.py) with train.optim.nesterov at its default (true): torch
    refuses Nesterov without momentum, so it is asked for only with momentum. A step is then p - lr * grad."""
    model = tiny_model()
    plain = TrainConfig(lr=0.1, weight_decay=0.0, optim=OptimConfig(name="sgd", sgd=SGDConfig(momentum=0.0)))
    optimizer = build_optimizer(model, plain, CPU)
    assert all(g["momentum"] == 0.0 and not g["nesterov"] for g in optimizer.param_groups)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model(input_ids=BATCH, labels=BATCH).loss.backward()
    optimizer.step()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), before[name] - 0.1 * p.grad, msg=name)
    momentum = build_optimizer(tiny_model(), TrainConfig(lr=0.1, optim=OptimConfig(name="sgd")), CPU)
    assert all(g["momentum"] == 0.9 and g["nesterov"] for g in momentum.param_groups)
