"""Weight initialisations by name (`arch.init`): the std of the normal each linear or embedding weight is drawn
from. A residual branch's output projection is marked `residual_output` (attention.py, ffn.py, gmlp.py).

A scheme reads the width it is given, never config.hidden_size: arch.parametrization decides which width that is
(parametrization.py: init_width). Under mup it is the base width, and muP's own 1 / sqrt(m) on the hidden matrices
supplies the width dependence, so a width-dependent scheme (`small`) composes with mup: hidden variance 1 / fan_in,
embeddings constant across widths. `normal` and `megatron-scaled` do not depend on the width."""

from .parametrization import parametrization
from .registry import Registry

INITS = Registry("init")


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


