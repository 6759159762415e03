"""`arch.parametrization=mup`: the Maximal Update Parametrization for Adam-family optimizers (Yang et al. 2022,
"Tensor Programs V", Table 3 and 8; the `mup` package's MuReadout / MuAdam), so that a learning rate tuned at width
arch.mup.base_width transfers to wider models. With width multiplier
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

from .parametrization import PARAMETRIZATIONS, Standard


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
