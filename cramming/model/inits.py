"""Weight initialisations by name (`arch.init`): the std of the normal each linear or embedding weight is drawn
from. A residual branch's output projection is marked `residual_output` (attention.py, ffn.py, gmlp.py)."""

from .registry import Registry

INITS = Registry("init")


@INITS.register_one("normal")
class Normal:
    """arch.init_std everywhere (Cramming: 0.02)."""

    def std(self, config, module) -> float:
        return config.init_std


@INITS.register_one("small")
class Small(Normal):
    """sqrt(2 / (5 hidden)) everywhere (Nguyen & Salazar 2019), whatever arch.init_std says."""

    def std(self, config, module) -> float:
        return (2 / (5 * config.hidden_size)) ** 0.5


@INITS.register_one("megatron-scaled")
class MegatronScaled(Normal):
    """arch.init_std, divided by sqrt(2 layers) on each residual branch's output projection, so the residual
    stream's variance does not grow with depth (Shoeybi et al. 2019)."""

    def std(self, config, module) -> float:
        if getattr(module, "residual_output", False):
            return config.init_std / (2 * config.num_layers) ** 0.5
        return config.init_std
