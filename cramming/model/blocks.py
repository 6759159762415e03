"""The blocks' extension points: the kinds of block a model stacks (`arch.layout`, BLOCKS: the transformer block
registers from modeling_crammed.py, gMLP from gmlp.py), what the rest of cramming asks a kind through its traits, and
the stack, how the blocks run when not every block in turn on every token (STACKS: unet.py, token_dropping.py).
"""

import abc

from .arch import ArchConfig
from .registry import Registry

BLOCKS = Registry("block", traits={
    "kv_cache": "its forward takes a KV cache slot (kv_cache.py): generation may cache it",
    "token_subsets": "it may run on a subset of the tokens (arch.token_dropping), given their positions",
    "takes_value_embedding": "its attention mixes arch.value_embeddings' tables into the values",
    "width_scaled": "every weight's fan-in is the width: arch.parametrization=mup covers it",
    "fixed_length": "it holds arch.max_seq_length-sized weights: no sequences past arch.max_seq_length",
})
BLOCKS.serves(ArchConfig, "layout")


def cache_problem(config) -> str | None:
    """Why a model of these blocks cannot generate with a KV cache, or None. A block kind opts in with
    `kv_cache = True` (its forward takes `cache`); the others are refused, so generation recomputes the prefix
    instead of giving a wrong answer. gMLP is refused: its spatial gate mixes positions through a learned
    (seq x seq) matrix and keeps no keys and values; caching it would mean storing every layer's gate inputs."""
    kinds = sorted({kind for kind in config.layout if not BLOCKS.trait(BLOCKS.get_or_explain(kind), "kv_cache")})
    if not kinds:
        return None
    return (f"no KV cache for arch.layout={config.layout}: {', '.join(kinds)} blocks keep no keys and values (only "
            f"{BLOCKS.choices('kv_cache')} blocks do); generation recomputes the prefix at every step")


STACKS = Registry("stack")


class Stack(abc.ABC):
    """What a stack answers (STACKS' entries subclass it): when the config asks for it, the modules the model holds
    for it, and how the blocks run. `stack(model, x, ctx, at, keep)`: CrammedModel.blocks' arguments. Built with the
    config, which a stack reads what it needs from (this one: nothing)."""

    def __init__(self, config):
        del config

    @staticmethod
    @abc.abstractmethod
    def chosen(config) -> bool:
        """Whether the config asks for this stack."""

    @staticmethod
    def weights(config) -> dict:
        """The modules the model holds for this stack, by the name checkpoints save them under."""
        return {}

    @staticmethod
    def importance(config):
        """What the MLM head holds to choose the tokens the stack keeps (token dropping), or None."""
        return None

    @abc.abstractmethod
    def __call__(self, model, x, ctx, at, keep=None):
        """The blocks run on the embedded tokens x (CrammedModel.blocks)."""


def stack_of(config):
    """The STACKS entry whose `chosen(config)` is true (validation refuses two together), or None: in turn."""
    chosen = [stack for stack in STACKS.values() if stack.chosen(config)]
    return chosen[0] if chosen else None


def build_stack(config):
    """How the blocks run: a stack built for the config (`stack(model, x, ctx, at, keep)`, CrammedModel.blocks'
    arguments), or None when every block runs in turn on every token."""
    stack = stack_of(config)
    return None if stack is None else stack(config)
