"""How the weights scale with width, by name (`arch.parametrization`).

`standard` is what every other option assumes; `mup` (mup.py) scales init, learning rate, logits and attention
with the width. The init schemes (`arch.init`) are here too, evaluated at the parametrization's init_width.
"""


from torch import nn

from .arch import ArchConfig
from .registry import Registry

PARAMETRIZATIONS = Registry("parametrization", traits={
    "needs_normalised_updates": "its learning-rate table is Adam's: optimizers with per-coordinate normalised steps",
    "width_relative": "it scales by the width against a base width (a narrower copy, rtd's generator, would be "
                      "scaled by the wrong one)",
})
PARAMETRIZATIONS.serves(ArchConfig, "parametrization")


@PARAMETRIZATIONS.register_one("standard")
class Standard:
    """Every width gets the same init std, learning rate, logit multiplier and 1 / sqrt(d) attention."""

    def width_multiplier(self, config) -> float:
        return 1.0

    def init_width(self, config) -> int:
        """The width arch.init's scheme is evaluated at (below)."""
        return config.hidden_size

    def hidden_std(self, config, std: float) -> float:
        return std

    def output_multiplier(self, config) -> float:
        return 1.0

    def attention_scale(self, config) -> float | None:
        """None: the kernel's own 1 / sqrt(head_dim)."""
        return None

    def hidden_lr_factor(self, config) -> float:
        return 1.0


def parametrization(config):
    """The entry arch.parametrization names (config: an ArchConfig or CrammedConfig; old checkpoints: standard)."""
    return PARAMETRIZATIONS.get_or_explain(getattr(config, "parametrization", "standard"))


def mark_hidden(module) -> None:
    """Mark every dense projection under `module` as a hidden matrix (muP's width-scaled init and learning rate)."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            sub.hidden_matrix = True


def hidden_weights(model) -> list:
    """The weights of the modules mark_hidden marked: the parameters muP gives train.lr / m."""
    return [m.weight for m in model.modules() if getattr(m, "hidden_matrix", False) and m.weight.requires_grad]


# ---------------------------------------------------------------- weight initialisations
# Weight initialisations by name (`arch.init`): the std of the normal each linear or embedding weight is drawn
# from. A residual branch's output projection is marked `residual_output` (modeling_crammed.py, gmlp.py).
#
# A scheme reads the width it is given, never config.hidden_size: arch.parametrization decides which width that is
# (parametrization.py: init_width). Under mup it is the base width, and muP's own 1 / sqrt(m) on the hidden matrices
# supplies the width dependence, so a width-dependent scheme (`small`) composes with mup: hidden variance 1 / fan_in,
# embeddings constant across widths. `normal` and `megatron-scaled` do not depend on the width.


INITS = Registry("init")
INITS.serves(ArchConfig, "init")


@INITS.register_one("normal")
class Normal:
    """arch.init_std everywhere (Cramming: 0.02)."""

    def std(self, config, module, width: int) -> float:
        return config.init_std


@INITS.register_one("small")
class Small(Normal):
    """sqrt(2 / (5 width)) everywhere (Nguyen & Salazar 2019), whatever arch.init_std says."""

    def std(self, config, module, width: int) -> float:
        return (2 / (5 * width)) ** 0.5


@INITS.register_one("megatron-scaled")
class MegatronScaled(Normal):
    """arch.init_std, divided by sqrt(2 layers) on each residual branch's output projection, so the residual
    stream's variance does not grow with depth (Shoeybi et al. 2019)."""

    def std(self, config, module, width: int) -> float:
        if getattr(module, "residual_output", False):
            return config.init_std / (2 * config.num_layers) ** 0.5
        return config.init_std


def init_std(config, module) -> float:
    """The std arch.init gives this module's weight; 0 for a residual branch's output projection under
    arch.zero_init_out (the speedrun's zero-initialised projections: every block starts as the identity, and the
    branch's other weights get gradients once its output projection has moved). The scheme is evaluated at
    arch.parametrization's init width, and a hidden matrix's std is then scaled by it (parametrization.py: the
    base width and 1 / sqrt(m) under mup)."""
    if getattr(config, "zero_init_out", False) and getattr(module, "residual_output", False):
        return 0.0
    chosen = parametrization(config)
    std = INITS.get_or_explain(config.init).std(config, module, chosen.init_width(config))
    return chosen.hidden_std(config, std) if getattr(module, "hidden_matrix", False) else std
