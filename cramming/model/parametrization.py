"""How the weights scale with width, by name (`arch.parametrization`).

`standard` is what every other option assumes. `mup` is the Maximal Update Parametrization for Adam-family
optimizers (Yang et al. 2022, "Tensor Programs V", Table 3 and 8; the `mup` package's MuReadout / MuAdam), so that
a learning rate tuned at width arch.mup.base_width transfers to wider models. With width multiplier
m = hidden_size / mup.base_width:
- hidden matrices (every dense projection inside the blocks, and the MLM head's transform) start at std
  init_std / sqrt(m) (fan-in scaling: variance 1 / fan_in) and get Adam learning rate train.lr / m and weight
  decay train.weight_decay * m, so their decay per step, lr * wd, is the base width's (MuAdam's rule for decay
  that is multiplied by the lr, as torch's AdamW and our Lion do);
- embeddings, norms, biases and the scalar mixing weights keep their init and learning rate;
- arch.init is evaluated at the base width (init_width): `small`'s sqrt(2 / (5 width)) then gives the embeddings
  the base model's std at every width and the hidden matrices sqrt(2 / (5 hidden_size)), 1 / fan_in variance;
- the readout's input is multiplied by 1 / m, W (h / m) + b as MuReadout (the readout is tied to the embeddings:
  the hidden states are scaled, never the shared weight, and the bias is not scaled), before arch.logit_softcap;
- attention scores are scaled by sqrt(d0) / d instead of 1 / sqrt(d), where d is the head dim and d0 the head dim
  at the base width (same heads): 1/d as muP asks, equal to 1 / sqrt(d) at m = 1 (the `mup` examples' 8/d at
  d0 = 64).
At m = 1 muP is the standard parametrization exactly: same init, learning-rate groups, logits and scores.
"""

import math

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


@PARAMETRIZATIONS.register_one("mup")
class Mup(Standard):
    """muP (Tensor Programs V): hidden init and learning rate scaled by the width, so a base width's tuning
    carries over to wider models."""

    needs_normalised_updates = True  # the lr / m table is Adam's: per-coordinate normalised steps (Lion's too)
    width_relative = True  # m = hidden_size / mup.base_width

    def width_multiplier(self, config) -> float:
        return config.hidden_size / config.mup.base_width

    def init_width(self, config) -> int:
        """The base width: a width-dependent arch.init (small) gives the base model's stds, and hidden_std's
        1 / sqrt(m) alone carries them to this width (else both scale: hidden std 1 / m, embeddings shrinking)."""
        return config.mup.base_width

    def hidden_std(self, config, std: float) -> float:
        return std / math.sqrt(self.width_multiplier(config))

    def output_multiplier(self, config) -> float:
        return 1.0 / self.width_multiplier(config)

    def attention_scale(self, config) -> float | None:
        head_dim = config.hidden_size // config.num_heads
        base_head_dim = config.mup.base_width / config.num_heads
        if head_dim == base_head_dim:
            return None  # the standard scale, bit for bit
        return math.sqrt(base_head_dim) / head_dim

    def hidden_lr_factor(self, config) -> float:
        return 1.0 / self.width_multiplier(config)



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
