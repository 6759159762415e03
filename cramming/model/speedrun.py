"""What the speedrun's architecture options refuse (config: a PretrainConfig), in one call for config.validate:
logit soft-capping, zero-initialised output projections, value embeddings and U-net skips (each in its module)."""

from . import softcap, unet, value_embeddings
from .inits import zero_init_problem


def problem(config) -> str | None:
    return (softcap.problem(config) or zero_init_problem(config) or value_embeddings.problem(config)
            or unet.problem(config))
