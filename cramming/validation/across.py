"""The checks that read more than one component's choice: what one component refuses of another (token dropping of
the blocks and positions, muP of the layers, an engine of the optimizer, whole-word masking of the objective). They
live here, above every component they read, so that no component imports another to check it, and the model's
files (which every checkpoint carries) hold only what loads and runs a model. Each is `check(c) -> str | None`
on a PretrainConfig; pretrain.across_sections runs them in CHECKS' order, and the first line stops the run."""

from ..data.local_text import encoding_problem
from ..data.share import prepared_problem
from ..engines import settings_problem
from ..impl import compile_problem
from ..model.linear import LINEARS, linear_problem
from ..model.modeling_crammed import BLOCKS, FFNS
from ..model.parametrization import PARAMETRIZATIONS
from ..model.patterns import PATTERNS
from ..model.positions import POSITIONS
from ..model.token_dropping import split
from ..registry import invalid
from ..train.curriculum import block_rows, seq_schedule_problem, stage_factors
from ..train.fp8 import fp8_problem
from ..train.masking import MASKINGS
from ..train.microbatch import microbatch_size
from ..train.nonfinite import NONFINITE
from ..train.objectives import OBJECTIVES
from ..train.schedule import window_schedule_problem


def data_problem(c) -> str | None:
    return encoding_problem(c.data.encoding, c.data.encoding_errors) or prepared_problem(c.data.prepared)


def curriculum_problem(c) -> str | None:
    return seq_schedule_problem(c) if c.train.seq_schedule else None


def window_problem(c) -> str | None:
    return window_schedule_problem(c) if c.train.window_schedule else None


def microbatch_problem(c) -> str | None:
    """impl.microbatch_size against the batch and the curriculum."""
    i, t = c.impl, c.train
    if not (i.microbatch_size == "auto" or (isinstance(i.microbatch_size, int) and i.microbatch_size > 0)):
        return invalid("impl.microbatch_size", i.microbatch_size, "must be a positive integer or auto")
    if i.microbatch_size == "auto":
        block = curriculum_block(t.seq_schedule, c.data.seq_length)
        if t.batch_size % block:
            return invalid("train.batch_size", t.batch_size, f"must be a multiple of {block} (the curriculum joins "
                           "that many rows)")
    elif t.batch_size % microbatch_size(c):
        return invalid("train.batch_size", t.batch_size,
                       f"must be a multiple of impl.microbatch_size={i.microbatch_size}")
    return None


def curriculum_block(seq_schedule, seq_length: int) -> int:
    return block_rows(stage_factors(seq_schedule, seq_length)) if seq_schedule else 1


def masking_problem(c) -> str | None:
    """Whole words and spans need an objective that masks."""
    if MASKINGS.trait(c.train.masking, "grouped") and not OBJECTIVES.trait(c.arch.objective, "masks_tokens"):
        masking = OBJECTIVES.choices("masks_tokens")
        return invalid("train.masking", c.train.masking, f"arch.objective={c.arch.objective} masks "
                       f"nothing; leave train.masking=token (or choose arch.objective={masking})")
    return None


# ---------------------------------------------------------------- the model's options against each other


def block_projections(config) -> dict[str, list[tuple[int, int]]]:
    """(in, out) of every projection in one block, by part: what arch.linear must be able to build."""
    ffn_in = config.ffn_size // 2 if FFNS.trait(config.ffn, "gated") else config.ffn_size
    h = config.hidden_size
    return {"attention": [(h, 3 * h), (h, h)], "ffn": [(h, config.ffn_size), (ffn_in, h)]}


def projections_problem(c) -> str | None:
    """What arch.linear cannot build among the projections of the parts in arch.linear_on, or None."""
    a = c.arch
    if not LINEARS.trait(a.linear, "structured"):  # one matrix: any shape
        return None
    for part in a.linear_on:
        for fan_in, fan_out in block_projections(a)[part]:
            if problem := linear_problem(a.linear, fan_in, fan_out, **a.linear_args.given()):
                return invalid("arch.linear", a.linear, f"cannot build the {part} projection {fan_in} -> {fan_out}: "
                               f"{problem}")
    return None


def parametrization_problem(c) -> str | None:
    """What muP is not defined for here (the optimizer's side: train/optim.py)."""
    a = c.arch
    if not PARAMETRIZATIONS.trait(a.parametrization, "width_relative"):
        return None
    if LINEARS.trait(a.linear, "structured") and a.linear_on:
        dense = LINEARS.choices("structured", has=False)
        return invalid("arch.linear", a.linear, "arch.parametrization=mup needs dense projections (a structured "
                       f"layer's factors have no single fan-in); use arch.linear={dense}")
    unscaled = [kind for kind in dict.fromkeys(a.layout) if not BLOCKS.trait(kind, "width_scaled")]
    if unscaled:
        return invalid("arch.layout", a.layout, f"arch.parametrization=mup does not scale {', '.join(unscaled)} "
                       "blocks (gMLP's spatial gate has the sequence as fan-in, not the width); use only "
                       f"{', '.join(BLOCKS.having('width_scaled'))} blocks")
    return None


def softcap_problem(c) -> str | None:
    """arch.logit_softcap: a positive cap or null."""
    cap = c.arch.logit_softcap
    if cap is not None and not cap > 0:
        return invalid("arch.logit_softcap", cap, "must be > 0 (the bound on the logits) or null (off)")
    return None


def zero_init_problem(c) -> str | None:
    """arch.zero_init_out zeroes dense projections only: a structured layer's output is a product of factors, and zero
    factors would give each other zero gradients for ever."""
    a = c.arch
    if a.zero_init_out and LINEARS.trait(a.linear, "structured") and a.linear_on:
        return invalid("arch.zero_init_out", True, f"needs dense projections, and arch.linear={a.linear} is a "
                       "product of factors (all zero, none would get a gradient); use "
                       f"arch.linear={LINEARS.choices('structured', has=False)}")
    return None


def value_embeddings_problem(c) -> str | None:
    """arch.value_embeddings: tables for the first and last k layers, all attention."""
    a = c.arch
    k = a.value_embeddings
    if k < 0 or 2 * k > a.num_layers:
        return invalid("arch.value_embeddings", k, f"must be in [0, arch.num_layers / 2 = {a.num_layers // 2}] "
                       "(table i serves layer i and its mirror among the last layers)")
    if k and not all(BLOCKS.trait(kind, "takes_value_embedding") for kind in a.layout):
        fits = ", ".join(BLOCKS.having("takes_value_embedding"))
        return invalid("arch.value_embeddings", k, f"mixes into attention values, and arch.layout={a.layout} has "
                       f"blocks without attention; use only {fits} blocks in arch.layout or arch.value_embeddings=0")
    return None


def unet_problem(c) -> str | None:
    """arch.unet_skips needs two halves."""
    if c.arch.unet_skips and c.arch.num_layers < 2:
        return invalid("arch.unet_skips", True, f"needs arch.num_layers >= 2 (got {c.arch.num_layers}): "
                       "the first half's outputs feed the second half")
    return None


def token_dropping_problem(c) -> str | None:
    """What arch.token_dropping refuses: the objective's pretraining model must drop tokens (`drops_tokens`);
    positions, patterns and blocks answer by their `token_subsets`."""
    a = c.arch
    drop = a.token_dropping
    if drop.keep is None or drop.keep >= 1.0:
        return None
    key = "arch.token_dropping.keep"
    head = getattr(OBJECTIVES.get(a.objective), "head", None)
    if head is None or not head.drops_tokens:
        return invalid(key, drop.keep, f"drops tokens in MLM pretraining only, not arch.objective={a.objective}; "
                       "set arch.objective=mlm or arch.token_dropping.keep=null")
    first, last = split(a) if drop.layers is None or len(drop.layers) == 2 else (0, 0)
    if drop.layers is not None and not 0 <= first < last <= a.num_layers - 1:
        return invalid("arch.token_dropping.layers", drop.layers,
                       f"give [first, last) with 0 <= first < last <= arch.num_layers - 1 = {a.num_layers - 1} "
                       "(the last layer always sees every token)")
    if first < 0:
        return invalid("arch.token_dropping.layers", drop.layers, f"the default [num_layers // 2 - 1, num_layers - 1) "
                       f"is empty at arch.num_layers={a.num_layers}; token dropping needs at least 2 layers")
    if not POSITIONS.trait(a.position, "token_subsets"):
        return invalid(key, drop.keep, f"needs positions that travel with the tokens "
                       f"({', '.join(POSITIONS.having('token_subsets'))}), not arch.position={a.position}")
    if [p for p in a.attention.pattern if not PATTERNS.trait(p, "token_subsets")]:
        return invalid(key, drop.keep, f"needs attention patterns whose masks do not follow positions, not "
                       f"arch.attention.pattern={a.attention.pattern}; use {PATTERNS.choices('token_subsets')}")
    if bad := [kind for kind in a.layout if not BLOCKS.trait(kind, "token_subsets")]:
        return invalid(key, drop.keep, f"the {bad[0]} blocks of arch.layout={a.layout} mix a fixed number of "
                       f"positions; use only {BLOCKS.choices('token_subsets')} blocks in arch.layout")
    if a.unet_skips:
        return invalid(key, drop.keep, "cannot run with arch.unet_skips=true (the skips join layers on both sides "
                       "of the dropping ones); set one of them off")
    if a.value_embeddings:
        return invalid(key, drop.keep, f"cannot run with arch.value_embeddings={a.value_embeddings}; set one off")
    return None


# ---------------------------------------------------------------- the engine against the rest


def engine_problem(config, engine, runtime) -> str | None:
    """Once the engine and the runtime are known: a policy that goes on past a non-finite step needs the engine to
    check every gradient (nonfinite_checked)."""
    policy = config.train.nonfinite
    if NONFINITE.trait(policy, "continues") and not engine.nonfinite_checked(config, runtime):
        return engine.unchecked_nonfinite_problem(config, policy, NONFINITE.lacking("continues"))
    return None


CHECKS = (data_problem, curriculum_problem, microbatch_problem, settings_problem, compile_problem, fp8_problem, masking_problem, projections_problem, parametrization_problem,
          softcap_problem, zero_init_problem, value_embeddings_problem, unet_problem, token_dropping_problem,
          window_problem)
