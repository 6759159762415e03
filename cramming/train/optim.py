"""Optimizers by name (train.optim.name), all with weight decay on matrices only (not on norms, biases, or the
position scale).

Every param group carries "base_lr", its peak learning rate: the trainer sets group["lr"] = group["base_lr"] *
schedule(...) before each step, so groups with different peaks (Muon's matrices, AdamW's rest, muP's hidden
matrices at train.lr / m) share one schedule.
"""

import torch

from ..config import OptimConfig
from ..engines import ENGINES, Engine
from ..errors import UserError
from ..model import modeling_crammed  # noqa: F401  (loads every variant: PARAMETRIZATIONS whole)
from ..model.parametrization import PARAMETRIZATIONS, hidden_weights, parametrization
from ..registry import Registry, invalid, own_problem
from .lion import Lion

OPTIMIZERS = Registry("optimizer", ask=lambda entry, config: chosen_optimizer_problem(entry, config), traits={
    "normalised_updates": "each coordinate's step is normalised, as Adam's or Lion's sign: muP's Adam table holds",
})
OPTIMIZERS.serves(OptimConfig, "name")


def build_optimizer(model: torch.nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer that cfg.optim.name names, over the trainable parameters of `model` (cfg: TrainConfig)."""
    return OPTIMIZERS.get_or_explain(cfg.optim.name)(Engine.unwrap(model), cfg)


def optimizer_problem(name: str) -> str | None:
    """An unknown optimizer name, in one line for the user, or None (what a known one lacks here is its own
    `problem`: muon_problem)."""
    if name not in OPTIMIZERS:
        return f"train.optim.name={name!r} is not a valid option; choose one of: {', '.join(sorted(OPTIMIZERS))}"
    return None


def chosen_optimizer_problem(entry, config) -> str | None:
    """What the chosen optimizer refuses in a run config: its own problem, then arch.parametrization's."""
    return own_problem(entry, config) or parametrization_problem(entry, config)


def parametrization_problem(entry, config) -> str | None:
    """muP's learning-rate table (Tensor Programs V, Table 3) is derived for per-coordinate normalised updates."""
    needs = PARAMETRIZATIONS.trait(config.arch.parametrization, "needs_normalised_updates")  # unknown: no traits
    if not needs or OPTIMIZERS.trait(entry, "normalised_updates"):
        return None
    fits = ", ".join(OPTIMIZERS.having("normalised_updates"))
    return invalid("train.optim.name", config.train.optim.name,
                   f"arch.parametrization={config.arch.parametrization} scales learning rates for optimizers with "
                   f"per-coordinate normalised updates only; use one of {fits} or arch.parametrization=standard")


def decay_groups(params, cfg, lr: float) -> list[dict]:
    """Trainable `params` split into a weight-decay group (ndim >= 2) and one without; empty groups dropped."""
    params = [p for p in params if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return [{**group, "lr": lr, "base_lr": lr} for group in groups if group["params"]]


def width_groups(model, cfg) -> list[dict]:
    """decay_groups at train.lr, plus arch.parametrization's hidden matrices in a decayed group of their own at
    train.lr times its factor (1 / m under mup) and train.weight_decay divided by it (m under mup); with a factor
    of 1 the groups are decay_groups' exactly.

    For optimizers whose decoupled decay is lr * wd per step (torch's AdamW, our Lion): the `mup` package's MuAdam
    with decoupled_wd=False does the same (lr /= width_mult, weight_decay *= width_mult), so a hidden matrix
    decays by train.lr * train.weight_decay per step at every width, as at the base width."""
    config = getattr(model, "config", None)
    factor = parametrization(config).hidden_lr_factor(config)
    if factor == 1.0:
        return decay_groups(model.parameters(), cfg, cfg.lr)
    hidden = {id(p) for p in hidden_weights(model)}
    rest = [p for p in model.parameters() if id(p) not in hidden]
    lr = cfg.lr * factor
    return [*decay_groups(rest, cfg, cfg.lr),
            {"params": hidden_weights(model), "weight_decay": cfg.weight_decay / factor, "lr": lr, "base_lr": lr}]


def fused_adamw(groups: list[dict], cfg) -> torch.optim.AdamW:
    # The fused kernel (CUDA and CPU) updates all tensors in one pass instead of one small op per tensor.
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=True)


@OPTIMIZERS.register("adamw", normalised_updates=True)
def adamw(model, cfg):
    """AdamW with decoupled weight decay (torch's fused kernel), Cramming's optimizer."""
    return fused_adamw(width_groups(model, cfg), cfg)


@OPTIMIZERS.register("sgd")
def sgd(model, cfg):
    """SGD with (Nesterov) momentum; its weight decay is the classic L2 term added to the gradient."""
    momentum = cfg.optim.sgd.momentum
    return torch.optim.SGD(decay_groups(model.parameters(), cfg, cfg.lr), lr=cfg.lr, momentum=momentum,
                           nesterov=cfg.optim.nesterov and momentum > 0)


@OPTIMIZERS.register("lion", normalised_updates=True)
def lion(model, cfg):
    """Lion with train.betas; it wants a smaller train.lr than AdamW (see lion.py)."""
    return Lion(width_groups(model, cfg), lr=cfg.lr, betas=tuple(cfg.betas))


def hidden_matrices(model) -> list[torch.nn.Parameter]:
    """Muon's share: the 2-D weights inside the blocks (model.encoder.layers). The embeddings, the output head,
    norms, biases, and the 3-D/4-D factors of structured linear layers (monarch, btt) stay with AdamW."""
    blocks = getattr(getattr(model, "encoder", None), "layers", None)
    if blocks is None:
        raise ValueError(f"muon needs the blocks at model.encoder.layers; {type(model).__name__} has none")
    return [p for p in blocks.parameters() if p.ndim == 2 and p.requires_grad]


def muon_missing() -> str | None:
    """This torch has no Muon."""
    if hasattr(torch.optim, "Muon"):
        return None
    return f"train.optim.name=muon needs torch.optim.Muon (torch >= 2.9); this is torch {torch.__version__}"


def muon_problem(config) -> str | None:
    """This torch has no Muon, or the engine slices the optimizer state, while Muon's update reads whole matrices
    (its lr and momentum: MuonConfig.RULES)."""
    engine = ENGINES.get(config.impl.distributed)  # auto: ddp or none, which keep the state whole
    return muon_missing() or (engine.sliced_state_problem(config) if engine is not None else None)


@OPTIMIZERS.register("muon", problem=muon_problem)
def muon(model, cfg):
    """Muon (Jordan et al. 2024: momentum orthogonalised by a Newton-Schulz iteration) for the blocks' matrices at
    peak lr train.optim.muon.lr, AdamW for the rest at train.lr; both decay by train.weight_decay times their own lr."""
    if problem := muon_missing():
        raise UserError(problem)
    matrices = hidden_matrices(model)
    if not matrices:
        raise UserError("train.optim.name=muon found no 2-D matrices in the blocks (structured linear layers keep "
                        "their weights in 3-D+ factors); choose another train.optim.name")
    taken = set(matrices)
    rest = [p for p in model.parameters() if p not in taken]
    o = cfg.optim
    hidden = torch.optim.Muon([{"params": matrices, "lr": o.muon.lr, "base_lr": o.muon.lr}], lr=o.muon.lr,
                              weight_decay=cfg.weight_decay, momentum=o.muon.momentum, nesterov=o.nesterov)
    return Combined(hidden, fused_adamw(decay_groups(rest, cfg, cfg.lr), cfg))


class Combined(torch.optim.Optimizer):
    """Optimizers over disjoint parameters, driven as one by the trainer, GradScaler and checkpoints.

    Its param_groups are the parts' own group dicts and its state is the one dict all parts write to, so
    Optimizer's zero_grad, state_dict and load_state_dict cover every part. load_state_dict builds new groups and
    a new state, which `share` then hands back to the parts."""

    def __init__(self, *parts: torch.optim.Optimizer):
        self.parts = parts
        super().__init__([group for part in parts for group in part.param_groups], defaults={})
        self.share()

    def share(self) -> None:
        groups = iter(self.param_groups)
        for part in self.parts:
            part.param_groups = [next(groups) for _ in part.param_groups]
            part.state = self.state

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.share()
