"""Typed config schema. Hydra composes the YAML presets in conf/; `load_config` checks the result against
these dataclasses (unknown keys, wrong types) and then `validate` checks choices and ranges, so a bad value
stops the run with one line before any data is read or any budget is spent.
"""

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import UserError


@dataclass
class AttentionConfig:
    pattern: list[str] = field(default_factory=lambda: ["global"])  # cycled over the attention blocks
    window: int = 64  # local: keys within this many positions on each side; stepped: the block length
    topk: int = 16  # topk: scores kept per query


@dataclass
class LinearArgs:
    """Sizes of the structured linear layers; null = the layer's default."""

    rank: int | None = None  # lowrank: bottleneck width; btt: the tensor-train rank
    blocks: int | None = None  # monarch: number of diagonal blocks
    cores: int | None = None  # btt, btt-moe: 2 or 3
    experts: int | None = None  # btt-moe
    experts_k: int | None = None  # btt-moe: experts per token


@dataclass
class ArchConfig:
    num_layers: int = 16
    hidden_size: int = 768
    num_heads: int = 12
    ffn_size: int = 3072
    ffn: str = "glu"  # mlp | glu
    activation: str = "gelu"
    norm: str = "layernorm"  # layernorm | rmsnorm | scalenorm
    norm_eps: float = 1e-12
    norm_position: str = "pre"  # pre | post
    qk_norm: bool = False  # normalise each head's queries and keys (with arch.norm)
    embedding_norm: bool = True
    final_norm: bool = True
    bias: bool = False
    position: str = "scaled-sinusoidal"  # learned | sinusoidal | scaled-sinusoidal | rotary | rpe | alibi | none
    rotary_pct: float = 1.0  # rotary: the share of each head's dims that is rotated (GPT-NeoX uses 0.25)
    rotary_base: float = 10000.0
    rotary_interleaved: bool = False  # rotary pairs: (i, i + d/2) as in GPT-NeoX, or (2i, 2i + 1) as in GPT-J
    rotary_every: int = 1  # rotary in every k-th attention block only
    rpe_buckets: int = 32  # rpe: T5 relative-position buckets
    rpe_max_distance: int = 128  # rpe: distances beyond this share the last bucket
    rpe_cache: bool = True  # rpe: compute the bias once per forward (true) or in every layer (false)
    layout: list[str] = field(default_factory=lambda: ["attention"])  # block kinds cycled over the layers
    gmlp_attn_dim: int = 0  # gmlp: width of aMLP's tiny attention; 0 = none
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    linear: str = "dense"  # dense | lowrank | kronecker | monarch | btt | btt-moe
    linear_on: list[str] = field(default_factory=lambda: ["ffn", "attention"])
    linear_args: LinearArgs = field(default_factory=LinearArgs)
    max_seq_length: int = 128
    tie_embeddings: bool = True
    objective: str = "mlm"  # mlm | clm (causal attention, next-token prediction)
    head_transform: bool = False
    sparse_prediction: bool = True
    init: str = "normal"  # normal | small | megatron-scaled
    init_std: float = 0.02
    hidden_dropout: float = 0.0  # off for pretraining, as in Cramming; eval turns dropout on
    attention_dropout: float = 0.0


@dataclass
class HubSource:
    path: str = ""
    name: str | None = None
    split: str = "train"
    text_field: str = "text"


@dataclass
class TokenizerConfig:
    kind: str = "wordpiece"  # wordpiece | bpe | unigram | a Hugging Face tokenizer name or folder
    train_max_chars: int = 100_000_000  # text used to learn the vocabulary


@dataclass
class DataConfig:
    source: str = "python-docs"  # python-docs | local-text | hub | sanity
    path: str | None = None  # local-text: a file, folder or glob
    text_field: str = "text"  # local-text: the field of .jsonl/.json/.parquet/.csv files
    encoding: str = "utf-8"  # local-text: how text, .jsonl, .json and .csv files are decoded (parquet is UTF-8)
    encoding_errors: str = "strict"  # strict | replace | ignore: what an undecodable byte does
    hub: list[HubSource] = field(default_factory=list)
    seq_length: int = 128
    vocab_size: int = 32768
    lowercase: bool = True
    strip_accents: bool = True
    ascii_only: bool = True
    max_chars: int | None = None  # stop reading the source after this many characters
    max_tokens: int | None = None  # stop tokenizing after this many tokens
    validation_fraction: float = 0.01
    filter_threshold: float | None = None  # keep a document only if tokens / characters < threshold
    dedup: bool = True
    ordering: str = "random"  # random | sentence-length
    # $CRAMMING_CACHE, else .cache/cramming under the working directory (conf/data/python-docs.yaml says the same)
    cache_dir: str = field(default_factory=lambda: os.environ.get("CRAMMING_CACHE", ".cache/cramming"))
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | lion | muon | sgd (lr, betas, eps, weight_decay: train.*)
    momentum: float = 0.9  # sgd
    nesterov: bool = True  # sgd, muon
    muon_lr: float = 0.02  # muon: peak lr of the hidden matrices (the rest use train.lr with AdamW)
    muon_momentum: float = 0.95


@dataclass
class TrainConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-12
    weight_decay: float = 0.01
    grad_clip: float | None = 0.5
    batch_size: int = 8192  # sequences per optimizer step, reached at the end of the ramp
    batch_ramp: float = 0.6  # budget fraction over which the batch grows linearly; 0 = full batch from the start
    schedule: str = "budget-triangle"  # budget-{triangle,cosine,linear,wsd}, constant; step-* twins need max_steps
    warmup: float = 0.1  # cosine, linear, wsd: share of the run spent warming up linearly from 0
    cooldown: float = 0.2  # wsd: final share of the run decaying linearly to 0
    seq_schedule: list | None = None  # [[budget_fraction, seq_length], ...]; null = data.seq_length
    optim: OptimConfig = field(default_factory=OptimConfig)
    max_steps: int | None = None  # null = the budget alone ends the run
    mask_prob: float = 0.25
    mask_token_share: float = 0.8  # of the masked positions: [MASK]; the rest split evenly random / unchanged
    validation_sequences: int = 2048
    validate_every_minutes: float | None = None  # also validate during the run (clock paused); null = start and end
    log_every: int = 1
    tensorboard: bool = False
    wandb: str = "off"  # off | offline (files under <run>/wandb, no network) | online; needs the wandb extra
    wandb_project: str = "cramming"
    checkpoint_every_minutes: float | None = 30.0  # null = only when stopped by a signal
    keep_checkpoints: int = 2
    resume: str = "auto"  # auto | never | a checkpoints/step-<n> folder
    nonfinite: str = "skip"  # skip | halt | rollback
    max_skipped: int = 10  # skip: halt after this many non-finite steps in a row
    rollback_lr_factor: float = 0.5  # rollback: learning rate multiplier after each rollback
    averaging: str = "none"  # none | ema | lawa: averaged weights, saved as <run>/final-<kind>/ too (train/averaging.py)
    ema_decay: float = 0.999  # ema: shadow = decay * shadow + (1 - decay) * weights after each step
    lawa_k: int = 5  # lawa: the latest k snapshots are averaged
    lawa_every_fraction: float = 0.05  # lawa: a snapshot each time this share of the budget passes


@dataclass
class DeepSpeedConfig:
    """Read under impl.distributed=deepspeed (cramming/engines/deepspeed.py)."""
    zero_stage: int = 1  # 0 | 1 (optimizer state sharded) | 2 (and gradients)
    onebit_adam: bool = False  # DeepSpeed's 1-bit Adam instead of train.optim: needs zero_stage=0 and CUDA
    freeze_step: int = 1000  # 1-bit Adam: steps of plain Adam (the variance warm-up) before compressing


@dataclass
class ImplConfig:
    device: str = "auto"  # auto | cuda | cpu
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    compile: bool | None = None  # null = on for cuda, off for cpu
    microbatch_size: Any = 128  # sequences per forward pass, or auto (the largest that fits the GPU)
    attention: str = "auto"  # auto | triton | sdpa | eager; auto = triton on CUDA, sdpa elsewhere
    rotary: str = "auto"  # auto | triton | torch; auto = triton on CUDA, torch elsewhere
    loss: str = "auto"  # auto | fused | plain: the training loss's head; auto = fused on CPU, plain on CUDA
    num_workers: int = 0
    distributed: str = "auto"  # auto | none | ddp | fsdp2 | deepspeed; auto = ddp under torchrun, none otherwise
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)


@dataclass
class PretrainConfig:
    name: str = "default"
    seed: int = 0
    budget: float = 24.0  # wall-clock hours of training
    dryrun: bool = False
    eval_after: bool = False  # fine-tune the fresh checkpoint with eval.py's recipe (cramming/sweep.py)
    eval_overrides: list[str] = field(default_factory=list)  # eval.py overrides for eval_after
    sweep_objective: str = "val_loss"  # val_loss | glue_average: what the run returns to a sweeper
    arch: ArchConfig = field(default_factory=ArchConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    impl: ImplConfig = field(default_factory=ImplConfig)


def load_config(cfg: DictConfig) -> PretrainConfig:
    """Hydra's composed config -> a validated PretrainConfig, or a UserError naming the bad key."""
    from .cli import check_no_missing

    check_no_missing(cfg)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(PretrainConfig), cfg)
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        first_line = str(err).splitlines()[0]
        raise UserError(f"config {key}: {first_line}" if key else f"config: {first_line}") from None
    validate(config)
    return config


def check_choice(key: str, value, choices) -> None:
    if value not in choices:
        raise UserError(f"{key}={value!r} is not a valid option; choose one of: {', '.join(sorted(choices))}")


def check(ok: bool, key: str, value, requirement: str) -> None:
    if not ok:
        raise UserError(f"{key}={value!r} is invalid: {requirement}")


def validate(c: PretrainConfig) -> None:
    """Choices and ranges. Registries are the single source of valid names."""
    from . import kernels  # noqa: F401  registers the Triton kernels by name
    from .data.local_text import check_encoding
    from .data.sources import SOURCES
    from .data.tokenizer import TOKENIZER_KINDS
    from .engines import CHOICES as ENGINES
    from .engines import settings_problem as engine_settings_problem
    from .model.attention import ATTENTION_KERNELS
    from .model.block import BLOCKS
    from .model.ffn import ACTIVATIONS, FFNS
    from .model.inits import INITS
    from .model.linear import LINEARS, block_projections, linear_problem
    from .model.losses import LOSSES
    from .model.norms import NORMS
    from .model.patterns import PATTERNS
    from .model.positions import POSITIONS
    from .model.rotary import ROTARY_IMPLS
    from .train.objectives import OBJECTIVES
    from .train.nonfinite import NONFINITE
    from .train.optim import optimizer_problem
    from .train.schedule import SCHEDULES, schedule_problem

    a, d, t, i = c.arch, c.data, c.train, c.impl
    check(c.budget > 0, "budget", c.budget, "must be > 0 hours")
    check(bool(c.name.strip()), "name", c.name, "name the run (its folder is outputs/<name>/<date>)")
    check_choice("sweep_objective", c.sweep_objective, ("val_loss", "glue_average"))
    for key in ("num_layers", "hidden_size", "num_heads", "ffn_size", "max_seq_length"):
        check(getattr(a, key) > 0, f"arch.{key}", getattr(a, key), "must be > 0")
    check(a.hidden_size % a.num_heads == 0, "arch.num_heads", a.num_heads, f"must divide arch.hidden_size={a.hidden_size}")
    check_choice("arch.ffn", a.ffn, FFNS)
    check(a.ffn != "glu" or a.ffn_size % 2 == 0, "arch.ffn_size", a.ffn_size, "must be even for a GLU")
    check_choice("arch.activation", a.activation, ACTIVATIONS)
    check_choice("arch.norm", a.norm, NORMS)
    check_choice("arch.norm_position", a.norm_position, ("pre", "post"))
    check_choice("arch.init", a.init, INITS)
    check_choice("arch.linear", a.linear, LINEARS)
    for part in a.linear_on:
        check_choice("arch.linear_on", part, ("ffn", "attention"))
    if a.linear != "dense":
        args = {k: v for k, v in vars(a.linear_args).items() if v is not None}
        for part in a.linear_on:
            for fan_in, fan_out in block_projections(a)[part]:
                problem = linear_problem(a.linear, fan_in, fan_out, **args)
                check(problem is None, "arch.linear", a.linear, f"cannot build the {part} projection "
                      f"{fan_in} -> {fan_out}: {problem}")
    check(a.init_std > 0, "arch.init_std", a.init_std, "must be > 0")
    check_choice("arch.position", a.position, POSITIONS)
    check(len(a.layout) > 0, "arch.layout", a.layout, "name at least one block kind")
    for kind in a.layout:
        check_choice("arch.layout", kind, BLOCKS)
    if "gmlp" in a.layout:
        check(a.ffn_size % 2 == 0, "arch.ffn_size", a.ffn_size, "must be even for gmlp blocks (split in halves)")
        check(a.gmlp_attn_dim >= 0, "arch.gmlp_attn_dim", a.gmlp_attn_dim, "must be >= 0")
        check(d.seq_length <= a.max_seq_length, "data.seq_length", d.seq_length,
              f"longer than the gmlp spatial matrix (arch.max_seq_length={a.max_seq_length}); raise it")
    check(len(a.attention.pattern) > 0, "arch.attention.pattern", a.attention.pattern, "name at least one pattern")
    for pattern in a.attention.pattern:
        check_choice("arch.attention.pattern", pattern, PATTERNS)
    for pattern in dict.fromkeys(a.attention.pattern):
        refuse(PATTERNS[pattern].problem(c, d.seq_length))
    check_choice("arch.objective", a.objective, OBJECTIVES)
    for key in ("hidden_dropout", "attention_dropout"):
        check(0 <= getattr(a, key) < 1, f"arch.{key}", getattr(a, key), "must be in [0, 1)")

    check_choice("data.source", d.source, SOURCES)
    check_encoding(d.encoding, d.encoding_errors)
    check(d.seq_length >= 8, "data.seq_length", d.seq_length, "must be >= 8")
    refuse(POSITIONS[a.position].problem(c))  # after the gmlp check, whose message is the more specific one
    check(d.vocab_size >= 64, "data.vocab_size", d.vocab_size, "must be >= 64")
    check(0 < d.validation_fraction < 0.5, "data.validation_fraction", d.validation_fraction, "must be in (0, 0.5)")
    if d.filter_threshold is not None:
        check(d.filter_threshold > 0, "data.filter_threshold", d.filter_threshold, "must be > 0 or null")
    check_choice("data.ordering", d.ordering, ("random", "sentence-length"))
    if d.source == "local-text":
        check(bool(d.path), "data.path", d.path, "data=local-text needs data.path=<file, folder or glob>")
    if d.source == "hub":
        check(bool(d.hub) and all(h.path for h in d.hub), "data.hub", d.hub, "name at least one hub dataset path")
    if d.tokenizer.kind in TOKENIZER_KINDS:
        check(d.tokenizer.train_max_chars > 0, "data.tokenizer.train_max_chars", d.tokenizer.train_max_chars, "must be > 0")

    check(t.lr > 0, "train.lr", t.lr, "must be > 0")
    check(all(0 <= b < 1 for b in t.betas), "train.betas", t.betas, "each must be in [0, 1)")
    check(t.batch_size > 0, "train.batch_size", t.batch_size, "must be > 0")
    check(0 <= t.batch_ramp < 1, "train.batch_ramp", t.batch_ramp, "must be in [0, 1)")
    check_choice("train.schedule", t.schedule, SCHEDULES)
    problem = schedule_problem(t.schedule, t.warmup, t.cooldown, t.max_steps) or optimizer_problem(t.optim.name)
    if problem:
        raise UserError(problem)
    if t.optim.name == "sgd":
        check(0 <= t.optim.momentum < 1, "train.optim.momentum", t.optim.momentum, "must be in [0, 1)")
    if t.optim.name == "muon":
        check(t.optim.muon_lr > 0, "train.optim.muon_lr", t.optim.muon_lr, "must be > 0")
        check(0 <= t.optim.muon_momentum < 1, "train.optim.muon_momentum", t.optim.muon_momentum, "must be in [0, 1)")
    if t.max_steps is not None:
        check(t.max_steps > 0, "train.max_steps", t.max_steps, "must be > 0 or null")
    check(0 < t.mask_prob < 1, "train.mask_prob", t.mask_prob, "must be in (0, 1)")
    check(0 <= t.mask_token_share <= 1, "train.mask_token_share", t.mask_token_share, "must be in [0, 1]")
    check(t.validation_sequences > 0, "train.validation_sequences", t.validation_sequences, "must be > 0")
    if t.validate_every_minutes is not None:
        check(t.validate_every_minutes > 0, "train.validate_every_minutes", t.validate_every_minutes,
              "must be > 0 or null")
    check(t.log_every > 0, "train.log_every", t.log_every, "must be > 0")
    if t.seq_schedule:
        check_seq_schedule(c)
    if t.checkpoint_every_minutes is not None:
        check(t.checkpoint_every_minutes > 0, "train.checkpoint_every_minutes", t.checkpoint_every_minutes,
              "must be > 0 or null")
    check(t.keep_checkpoints >= 1, "train.keep_checkpoints", t.keep_checkpoints, "must be >= 1")
    check_choice("train.nonfinite", t.nonfinite, NONFINITE)
    check(t.max_skipped >= 1, "train.max_skipped", t.max_skipped, "must be >= 1")
    check(0 < t.rollback_lr_factor <= 1, "train.rollback_lr_factor", t.rollback_lr_factor, "must be in (0, 1]")
    if t.tensorboard:
        check(importlib.util.find_spec("tensorboard") is not None, "train.tensorboard", t.tensorboard,
              "needs the tensorboard package: pip install 'cramming[tensorboard]'")
    check_choice("train.wandb", t.wandb, ("off", "offline", "online"))
    if t.wandb != "off":
        check(importlib.util.find_spec("wandb") is not None, "train.wandb", t.wandb,
              "needs the wandb package: pip install 'cramming[wandb]'")
        check(bool(t.wandb_project), "train.wandb_project", t.wandb_project, "must not be empty")
    if t.grad_clip is not None:
        check(t.grad_clip > 0, "train.grad_clip", t.grad_clip, "must be > 0 or null")

    check_choice("impl.device", i.device, ("auto", "cuda", "cpu"))
    check_choice("impl.precision", i.precision, ("auto", "fp32", "bf16", "fp16"))
    check_choice("impl.attention", i.attention, ("auto", *ATTENTION_KERNELS))
    check_choice("impl.rotary", i.rotary, ("auto", *ROTARY_IMPLS))
    check(i.microbatch_size == "auto" or (isinstance(i.microbatch_size, int) and i.microbatch_size > 0),
          "impl.microbatch_size", i.microbatch_size, "must be a positive integer or auto")
    if i.microbatch_size == "auto":
        block = curriculum_block(t.seq_schedule, d.seq_length)
        check(t.batch_size % block == 0, "train.batch_size", t.batch_size,
              f"must be a multiple of {block} (the curriculum joins that many rows)")
    else:
        check(t.batch_size % microbatch_size(c) == 0, "train.batch_size", t.batch_size,
              f"must be a multiple of impl.microbatch_size={i.microbatch_size}")
    check(i.num_workers >= 0, "impl.num_workers", i.num_workers, "must be >= 0")
    check_choice("impl.distributed", i.distributed, ENGINES)
    check_choice("impl.loss", i.loss, ("auto", *LOSSES))
    refuse(engine_settings_problem(c))
    from .train.averaging import problem as averaging_problem  # the hook of train.averaging (train/averaging.py)
    refuse(averaging_problem(c))


def refuse(problem: str | None) -> None:
    """Stop on what a registered component refuses (its `problem`)."""
    if problem:
        raise UserError(problem)


def check_seq_schedule(c: PretrainConfig) -> None:
    """The curriculum's stages against the data, the batch and the architecture (see train/curriculum.py)."""
    from .model.patterns import PATTERNS
    from .model.positions import POSITIONS
    from .train.curriculum import sequence_length

    a, d, t = c.arch, c.data, c.train
    key = "train.seq_schedule"
    check(all(isinstance(stage, (list, tuple)) and len(stage) == 2 and all(isinstance(v, (int, float)) for v in stage)
              and stage[0] > 0 for stage in t.seq_schedule), key, t.seq_schedule,
          "give [budget_fraction > 0, seq_length] pairs")
    check(abs(sum(stage[0] for stage in t.seq_schedule) - 1) < 1e-6, key, t.seq_schedule,
          "the stages' budget fractions must add up to 1")
    check(d.ordering == "random", key, t.seq_schedule, "needs data.ordering=random (rows are joined in stream order)")
    for _, length in t.seq_schedule:
        check(length >= d.seq_length and length % d.seq_length == 0, key, t.seq_schedule,
              f"every length must be a multiple of data.seq_length={d.seq_length}, got {length:g}")
        k = int(length) // d.seq_length
        tokens = sequence_length(d.seq_length, k)
        check(c.impl.microbatch_size == "auto" or microbatch_size(c) % k == 0, key, t.seq_schedule,
              f"a {int(length)} stage joins {k} rows, so impl.microbatch_size must be a multiple of {k}")
        if POSITIONS[a.position].table is not None or "gmlp" in a.layout:
            check(tokens <= a.max_seq_length, key, t.seq_schedule,
                  f"its {tokens}-token sequences are longer than arch.max_seq_length={a.max_seq_length} "
                  f"({a.position} positions{' and gmlp' if 'gmlp' in a.layout else ''} do not extrapolate); "
                  "raise it, or use rotary, alibi, rpe or none")
        for pattern in dict.fromkeys(a.attention.pattern):
            problem = PATTERNS[pattern].problem(c, tokens, "the stage length")
            check(problem is None, key, t.seq_schedule, f"a stage refused by arch.attention.pattern: {problem}")


def curriculum_block(seq_schedule, seq_length: int) -> int:
    from .train.curriculum import block_rows, stage_factors

    return block_rows(stage_factors(seq_schedule, seq_length)) if seq_schedule else 1


def microbatch_size(c: PretrainConfig) -> int | None:
    """Sequences per forward pass: impl.microbatch_size, or the whole batch when that is smaller; None for auto
    (decided once the model is built: train/microbatch.py)."""
    if c.impl.microbatch_size == "auto":
        return None
    return min(c.impl.microbatch_size, c.train.batch_size)
