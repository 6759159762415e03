"""The architecture's options: one definition, read by the run config (`arch.*`, cramming/config.py) and by the
model's Hugging Face config (CrammedConfig), so a default or a name cannot differ between the two.

Plain dataclasses with no imports beyond the standard library: checkpoints carry this file, and cramming.config
reads it without importing torch.
"""

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class AttentionConfig:
    pattern: list[str] = field(default_factory=lambda: ["global"])  # cycled over the attention blocks
    window: int = 64  # local: keys within this many positions on each side; stepped: the block length
    topk: int = 16  # topk: scores kept per query

    REGISTERED: ClassVar[dict] = {"pattern": ()}  # served by model/patterns.py's PATTERNS


@dataclass
class LinearArgs:
    """Sizes of the structured linear layers; null = the layer's default."""

    rank: int | None = None  # lowrank: bottleneck width; btt: the tensor-train rank
    blocks: int | None = None  # monarch: number of diagonal blocks
    cores: int | None = None  # btt, btt-moe: 2 or 3
    experts: int | None = None  # btt-moe
    experts_k: int | None = None  # btt-moe: experts per token

    def given(self) -> dict:
        """The sizes set, as the layers' keyword arguments (an unset size takes the layer's default)."""
        return {name: value for name, value in vars(self).items() if value is not None}


@dataclass
class RotaryConfig:
    """position=rotary (model/rotary.py): how much of each head turns, how fast, and in which blocks."""

    pct: float = 1.0  # the share of each head's dims that is rotated (GPT-NeoX uses 0.25)
    base: float = 10000.0  # the frequencies' base
    interleaved: bool = False  # which dims pair up: (i, i + d/2) as in GPT-NeoX, or (2i, 2i + 1) as in GPT-J
    every: int = 1  # rotary in every k-th attention block only

    COMPONENT: ClassVar[tuple] = ("position", "rotary")  # read only when arch.position=rotary (cramming/rules.py)
    RULES: ClassVar[dict] = {"pct": "(0, 1]", "base": "> 1", "every": ">= 1: 1 = every attention block"}


@dataclass
class RPEConfig:
    """position=rpe (model/positions.py): T5's relative-position buckets."""

    buckets: int = 32  # T5 relative-position buckets
    max_distance: int = 128  # distances beyond this share the last bucket
    cache: bool = True  # compute the bias once per forward (true) or in every layer (false)

    COMPONENT: ClassVar[tuple] = ("position", "rpe")
    RULES: ClassVar[dict] = {"buckets": ">= 4"}


@dataclass
class GMLPConfig:
    """gmlp blocks in arch.layout (model/gmlp.py)."""

    attn_dim: int = 0  # width of aMLP's tiny attention; 0 = none

    COMPONENT: ClassVar[tuple] = ("layout", "gmlp")
    RULES: ClassVar[dict] = {"attn_dim": ">= 0"}


@dataclass
class MupConfig:
    """parametrization=mup (model/mup.py)."""

    base_width: int = 128  # the hidden_size at which muP equals the standard parametrization

    COMPONENT: ClassVar[tuple] = ("parametrization", "mup")
    RULES: ClassVar[dict] = {"base_width": "> 0"}


@dataclass
class RTDConfig:
    """objective=rtd (ELECTRA): the generator's size relative to the discriminator, and the detection loss's weight."""

    generator_scale: float = 0.25  # heads (and so width) and FFN of the generator: the discriminator's x this
    generator_layers: int | None = None  # null = arch.num_layers
    weight: float = 50.0  # loss = generator MLM loss + weight x detection loss (ELECTRA's lambda)
    tie_embeddings: bool = True  # the generator reads and predicts through the discriminator's embeddings

    COMPONENT: ClassVar[tuple] = ("objective", "rtd")  # read only when arch.objective=rtd (cramming/rules.py)
    RULES: ClassVar[dict] = {"generator_scale": "(0, 1]", "generator_layers": "> 0 or null", "weight": "> 0"}
    # What a section saved in config.json before the key existed meant (configuration_crammed.arch_value).
    SAVED_BEFORE: ClassVar[dict] = {"tie_embeddings": False}


@dataclass
class TokenDroppingConfig:
    """Token dropping (Hou et al. 2022, model/token_dropping.py): in MLM pretraining the layers [first, last) update
    only the sequence's most important tokens; the others skip them and rejoin, with the state they had entering
    `first`, before layer `last`. The default is the TF reference's split."""

    keep: float | None = None  # share of each sequence's tokens the dropping layers see; null or 1.0 = off
    # [first, last): the layers that update only the kept tokens; null = the reference's [L // 2 - 1, L - 1)
    layers: list[int] | None = None
    cross_first: bool = True  # layer `first`'s kept queries attend to every token (the reference); false: kept only
    decay: float = 0.995  # the per-token-id running MLM loss: avg <- decay * avg + (1 - decay) * loss

    RULES: ClassVar[dict] = {"keep": "(0, 1] or null", "decay": "[0, 1)"}


@dataclass
class ArchConfig:
    num_layers: int = 16  # blocks in the encoder (or decoder)
    hidden_size: int = 768  # the residual stream's width
    num_heads: int = 12  # attention heads; must divide hidden_size
    ffn_size: int = 3072  # the feed-forward block's inner width
    ffn: str = "glu"  # the feed-forward block
    activation: str = "gelu"  # the feed-forward block's nonlinearity
    norm: str = "layernorm"  # the normalisation layer used everywhere
    norm_eps: float = 1e-12  # the normalisation layers' epsilon
    norm_position: str = "pre"  # normalise each block's input (pre-LN) or its residual sum (post-LN)
    first_attention_norm: bool = True  # pre-LN: normalise the first block's attention input (ModernBERT: no)
    qk_norm: bool = False  # normalise each head's queries and keys (with arch.norm)
    embedding_norm: bool = True  # normalise the embeddings before the first block
    final_norm: bool = True  # normalise after the last block
    bias: bool = False  # biases in the projections and the decoder
    position: str = "scaled-sinusoidal"  # how the model knows token positions
    rotary: RotaryConfig = field(default_factory=RotaryConfig)
    rpe: RPEConfig = field(default_factory=RPEConfig)
    layout: list[str] = field(default_factory=lambda: ["attention"])  # block kinds cycled over the layers
    gmlp: GMLPConfig = field(default_factory=GMLPConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    linear: str = "dense"  # the kind of matrix in the projections named by linear_on
    linear_on: list[str] = field(default_factory=lambda: ["ffn", "attention"])  # the projections that use arch.linear
    linear_args: LinearArgs = field(default_factory=LinearArgs)
    max_seq_length: int = 128  # the longest sequence: sizes learned position tables and gMLP's spatial matrix
    tie_embeddings: bool = True  # the LM head reuses the input embedding matrix
    objective: str = "mlm"  # the pretraining objective (clm: causal attention, next-token prediction)
    rtd: RTDConfig = field(default_factory=RTDConfig)
    head_transform: bool = False  # a dense + activation + norm transform before the LM head (BERT's)
    sparse_prediction: bool = True  # mlm pretraining: the LM head on the masked positions only (forward: all)
    init: str = "normal"  # the weights' initialisation scheme
    init_std: float = 0.02  # the normal initialisation's standard deviation
    hidden_dropout: float = 0.0  # off for pretraining, as in Cramming; eval turns dropout on
    attention_dropout: float = 0.0  # dropout on the attention probabilities; eval turns it on
    logit_softcap: float | None = None  # c * tanh(logits / c) on the LM head's logits (the speedrun's); null = off
    zero_init_out: bool = False  # attention and FFN output projections start at zero
    value_embeddings: int = 0  # token-embedding tables mixed into the values of the first and last k layers
    unet_skips: bool = False  # first half's block outputs added to the mirrored second half's inputs
    parametrization: str = "standard"  # how init, lr, logits and attention scale with width
    mup: MupConfig = field(default_factory=MupConfig)
    token_dropping: TokenDroppingConfig = field(default_factory=TokenDroppingConfig)

    # What each plain option accepts (cramming/rules.py).
    RULES: ClassVar[dict] = {
        "num_layers": "> 0", "hidden_size": "> 0", "num_heads": "> 0", "ffn_size": "> 0", "max_seq_length": "> 0",
        "norm_position": ("pre", "post"), "linear_on": ("ffn", "attention"),
        "init_std": "> 0", "hidden_dropout": "[0, 1)", "attention_dropout": "[0, 1)",
    }
    # The options naming registered components, asked in this order (position after the blocks and the patterns:
    # their messages say more). Each registry declares the option it serves (FFNS.serves(ArchConfig, "ffn"), in
    # modeling_crammed.py; OBJECTIVES in train/objectives.py), so this file imports nothing.
    REGISTERED: ClassVar[dict] = {"ffn": (), "activation": (), "norm": (), "init": (), "linear": (), "layout": (),
                                  "objective": (), "position": (), "parametrization": ()}
