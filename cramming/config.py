"""The run's typed config schema: dataclasses only, the one place each option's default and rule is declared.
Hydra composes the YAML presets in conf/ onto them; cramming/validation/ loads the result and checks it (each
field's declared rule, the chosen components, what spans sections) before any work.
"""

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import OmegaConf

from .model.arch import ArchConfig, AttentionConfig, LinearArgs  # noqa: F401  the schema lives with the model
from .schema import register


def cache_default() -> str:
    """data.cache_dir's default, shared by runs from any directory: $CRAMMING_CACHE, else $XDG_CACHE_HOME/cramming,
    else ~/.cache/cramming."""
    if os.environ.get("CRAMMING_CACHE"):
        return os.environ["CRAMMING_CACHE"]
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cramming")


if not OmegaConf.has_resolver("cramming_cache"):
    OmegaConf.register_new_resolver("cramming_cache", cache_default)


@dataclass
class HubSource:
    path: str = ""
    name: str | None = None
    split: str = "train"
    text_field: str = "text"


@dataclass
class TokenizerConfig:
    kind: str = "wordpiece"  # wordpiece, bpe, unigram, or a Hugging Face tokenizer name or folder
    train_max_chars: int = 100_000_000  # text used to learn the vocabulary

    RULES: ClassVar[dict] = {"train_max_chars": "> 0"}  # what each plain option accepts (cramming/rules.py)


@dataclass
class DataConfig:
    source: str = "python-docs"  # where the text comes from
    path: str | None = None  # local-text: a file, folder or glob
    text_field: str = "text"  # local-text: the field of .jsonl/.json/.parquet/.csv files
    encoding: str = "utf-8"  # local-text: how text, .jsonl, .json and .csv files are decoded (parquet is UTF-8)
    encoding_errors: str = "strict"  # local-text: what an undecodable byte does
    hub: list[HubSource] = field(default_factory=list)  # source=hub: the datasets streamed, in order
    seq_length: int = 128  # tokens per training sequence
    vocab_size: int = 32768  # the tokenizer's vocabulary, learned from the data
    lowercase: bool = True  # the tokenizer lowercases
    strip_accents: bool = True  # the tokenizer strips accents (after NFD)
    ascii_only: bool = True  # the tokenizer drops non-ASCII characters
    max_chars: int | None = None  # stop reading the source after this many characters
    max_tokens: int | None = None  # stop tokenizing after this many tokens
    validation_fraction: float = 0.01  # share of the sequences held out for the validation loss
    filter_threshold: float | None = None  # keep a document only if tokens / characters < threshold
    dedup: bool = True  # drop exact duplicate documents
    ordering: str = "random"  # the training order: random, or sorted by sentence count (Cramming's curriculum)
    document_masking: bool = False  # keep the documents packed in a row apart: no attention across, positions restart
    # prepared data: $CRAMMING_CACHE, else $XDG_CACHE_HOME/cramming, else ~/.cache/cramming
    cache_dir: str = field(default_factory=cache_default)
    prepared: str | None = None  # train on this prepared folder (data_only=true prints one; or an exported dataset)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    RULES: ClassVar[dict] = {"seq_length": ">= 8", "vocab_size": ">= 64", "validation_fraction": "(0, 0.5)",
                             "filter_threshold": "> 0 or null", "ordering": ("random", "sentence-length")}
    REGISTERED: ClassVar[dict] = {"source": ()}  # options naming registered components (data/sources.py)


@dataclass
class SGDConfig:
    """train.optim.name=sgd."""

    momentum: float = 0.9  # the heavy-ball (or Nesterov) momentum; 0 = plain SGD

    COMPONENT: ClassVar[tuple] = ("name", "sgd")  # read only when this optimizer is chosen (cramming/rules.py)
    RULES: ClassVar[dict] = {"momentum": "[0, 1)"}


@dataclass
class MuonConfig:
    """train.optim.name=muon: the hidden matrices' optimizer (the rest use train.lr with AdamW)."""

    lr: float = 0.02  # peak lr of the hidden matrices
    momentum: float = 0.95  # momentum of the hidden matrices

    COMPONENT: ClassVar[tuple] = ("name", "muon")
    RULES: ClassVar[dict] = {"lr": "> 0", "momentum": "[0, 1)"}


@dataclass
class OptimConfig:
    name: str = "adamw"  # the optimizer (lr, betas, eps, weight_decay: train.*)
    nesterov: bool = True  # sgd, muon: Nesterov momentum
    sgd: SGDConfig = field(default_factory=SGDConfig)
    muon: MuonConfig = field(default_factory=MuonConfig)

    REGISTERED: ClassVar[dict] = {"name": ()}  # served by train/optim.py's OPTIMIZERS


@dataclass
class SkipConfig:
    """train.nonfinite=skip."""

    max_in_row: int = 10  # halt after this many non-finite steps in a row

    COMPONENT: ClassVar[tuple] = ("nonfinite", "skip")
    RULES: ClassVar[dict] = {"max_in_row": ">= 1"}


@dataclass
class RollbackConfig:
    """train.nonfinite=rollback."""

    lr_factor: float = 0.5  # learning rate multiplier after each rollback

    COMPONENT: ClassVar[tuple] = ("nonfinite", "rollback")
    RULES: ClassVar[dict] = {"lr_factor": "(0, 1]"}


@dataclass
class EMAConfig:
    """train.averaging=ema (train/averaging.py)."""

    decay: float = 0.999  # shadow = decay * shadow + (1 - decay) * weights after each step

    COMPONENT: ClassVar[tuple] = ("averaging", "ema")
    RULES: ClassVar[dict] = {
        "decay": "(0, 1): the share of the average kept at each step, e.g. 0.999 (about the last 1000 steps)"}


@dataclass
class LAWAConfig:
    """train.averaging=lawa (train/averaging.py)."""

    k: int = 5  # the latest k snapshots are averaged
    every_fraction: float = 0.05  # a snapshot each time this share of the budget passes

    COMPONENT: ClassVar[tuple] = ("averaging", "lawa")
    RULES: ClassVar[dict] = {"k": ">= 1: the number of latest snapshots averaged",
                             "every_fraction": "(0, 1]: the budget fraction between snapshots, e.g. 0.05"}


@dataclass
class SpanConfig:
    """train.masking=span (train/masking.py): SpanBERT's span lengths."""

    p: float = 0.2  # span lengths are geometric: P(l) proportional to p (1 - p)^(l - 1), l = 1, 2, ...
    max_length: int = 10  # the longest span (the distribution truncated there and renormalised: mean 3.8)

    COMPONENT: ClassVar[tuple] = ("masking", "span")
    RULES: ClassVar[dict] = {"p": "(0, 1]", "max_length": ">= 1"}


@dataclass
class TrainConfig:
    lr: float = 1e-3  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)  # Adam's (and Lion's) betas
    eps: float = 1e-12  # Adam's epsilon
    weight_decay: float = 0.01  # decoupled weight decay (not on biases and norms)
    grad_clip: float | None = 0.5  # clip the gradient norm at this; null = off
    batch_size: int = 8192  # sequences per optimizer step, reached at the end of the ramp
    batch_ramp: float = 0.6  # budget fraction over which the batch grows linearly; 0 = full batch from the start
    schedule: str = "budget-triangle"  # the learning-rate schedule; step-* ones need max_steps
    warmup: float = 0.1  # cosine, linear, wsd: share of the run spent warming up linearly from 0
    cooldown: float = 0.2  # wsd: final share of the run decaying linearly to 0
    seq_schedule: list | None = None  # [[budget_fraction, seq_length], ...]; null = data.seq_length
    optim: OptimConfig = field(default_factory=OptimConfig)
    max_steps: int | None = None  # null = the budget alone ends the run
    mask_prob: float = 0.25  # mlm: share of each sequence's tokens masked
    mask_token_share: float = 0.8  # of the masked tokens (or spans): [MASK]; the rest split evenly random / unchanged
    masking: str = "token"  # mlm, rtd: what is masked together: single tokens, whole words or SpanBERT's spans
    span: SpanConfig = field(default_factory=SpanConfig)
    validation_sequences: int = 2048  # sequences of the validation loss
    validate_every_minutes: float | None = None  # also validate during the run (clock paused); null = start and end
    target_loss: float | None = None  # end the run at the first periodic validation loss <= this; null = off
    log_every: int = 1  # log a metrics line every this many steps
    tensorboard: bool = False  # also write the scalars to <run>/tensorboard (the tensorboard extra)
    wandb: str = "off"  # W&B: off, offline (<run>/wandb, no network) or online; wandb extra
    wandb_project: str = "cramming"  # W&B project; the run is named by `name`
    checkpoint_every_minutes: float | None = 30.0  # null = only when stopped by a signal
    keep_checkpoints: int = 2  # checkpoints kept (the oldest are deleted)
    resume: str = "auto"  # auto (the newest complete checkpoint of the run), never, or a checkpoints/step-<n> folder
    # a new run from these weights: a checkpoint/ or checkpoints/step-<n> folder, or a BertForMaskedLM (folder or hub id)
    init_from: str | None = None
    trust_remote_code: bool = False  # train.init_from: read a folder whose model code is not this cramming's own
    nonfinite: str = "skip"  # what a non-finite loss or gradient does
    skip: SkipConfig = field(default_factory=SkipConfig)
    rollback: RollbackConfig = field(default_factory=RollbackConfig)
    window_schedule: list | None = None  # [[budget_fraction, window], ...]: the local/stepped window grows with the run
    averaging: str = "none"  # averaged weights, saved as <run>/final-<kind>/ too (train/averaging.py)
    ema: EMAConfig = field(default_factory=EMAConfig)
    lawa: LAWAConfig = field(default_factory=LAWAConfig)

    RULES: ClassVar[dict] = {
        "lr": "> 0", "betas": "each [0, 1)", "grad_clip": "> 0 or null", "batch_size": "> 0", "batch_ramp": "[0, 1)",
        "max_steps": "> 0 or null", "mask_prob": "(0, 1)", "mask_token_share": "[0, 1]",
        "validation_sequences": "> 0", "validate_every_minutes": "> 0 or null", "log_every": "> 0",
        "target_loss": "> 0 or null",
        "wandb": ("off", "offline", "online"), "checkpoint_every_minutes": "> 0 or null", "keep_checkpoints": ">= 1",
    }
    # served by train/schedule.py, nonfinite.py, averaging.py and masking.py
    REGISTERED: ClassVar[dict] = {"schedule": (), "nonfinite": (), "averaging": (), "masking": ()}


@dataclass
class DeepSpeedConfig:
    """Read under impl.distributed=deepspeed (cramming/engines/deepspeed.py)."""
    zero_stage: int = 1  # 0, 1 (optimizer state sharded) or 2 (and gradients)
    onebit_adam: bool = False  # DeepSpeed's 1-bit Adam instead of train.optim: needs zero_stage=0 and CUDA
    freeze_step: int = 1000  # 1-bit Adam: steps of plain Adam (the variance warm-up) before compressing


@dataclass
class Fp8Config:
    """Read under impl.precision=fp8 (cramming/train/fp8.py)."""
    recipe: str = "tensorwise"  # torchao's float8 scales: one per tensor, or per row (rowwise: finer, slower)
    min_elements: int = 589824  # block projections with fewer weights (in x out; 768x768 here) stay bf16
    emulate: bool = False  # float8 casts, high-precision matmuls: any device (CPU too), slow; to test numerics

    COMPONENT: ClassVar[tuple] = ("precision", "fp8")
    RULES: ClassVar[dict] = {"recipe": ("tensorwise", "rowwise"), "min_elements": ">= 0"}


@dataclass
class ImplConfig:
    device: str = "auto"  # where to run; auto = cuda if present
    precision: str = "auto"  # auto: bf16 on GPUs from capability 8.0, fp16 before; CPUs: bf16 where native and faster
    compile: bool | None = None  # null = on for cuda, off for cpu
    microbatch_size: Any = 128  # sequences per forward pass, or auto (the largest that fits the GPU)
    attention: str = "auto"  # the attention kernel; auto = triton on CUDA, matmul for bf16 on CPU, else sdpa
    rotary: str = "auto"  # the rotary kernel; auto = triton on CUDA, torch elsewhere
    loss: str = "auto"  # the loss head (fused: in chunks); auto = fused on CPU, plain on CUDA
    num_workers: int = 0  # data loader worker processes
    distributed: str = "auto"  # multi-process engine; auto = ddp under torchrun, else none
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    compile_mode: str = "default"  # torch.compile's mode (impl.py)
    peak_tflops: float | None = None  # the GPU's dense 16-bit peak for MFU; null = impl.py's table, by device name
    activation_checkpointing: bool = False  # recompute each block in the backward pass: less memory, more compute
    fp8: Fp8Config = field(default_factory=Fp8Config)

    RULES: ClassVar[dict] = {"device": ("auto", "cuda", "cpu"), "precision": ("auto", "fp32", "bf16", "fp16", "fp8"),
                             "num_workers": ">= 0", "peak_tflops": "> 0 or null"}
    # The kernels eval.py reads too; engines are asked once the world is known (Engine.problem).
    # the kernels' and the loss's registries are served by impl.py, which resolves auto; the engines' by engines/
    REGISTERED: ClassVar[dict] = {"attention": ("auto",), "rotary": ("auto",), "loss": ("auto",),
                                  "distributed": ("auto",)}


@dataclass
class PretrainConfig:
    name: str = "default"  # the run's name: its folder is outputs/<name>/<date>_<time>, so a relative path inside outputs/
    seed: int = 0  # one seed for model init, data order and masking
    budget: float = 24.0  # wall-clock hours of training; the clock starts after data preparation and model build
    dryrun: bool = False  # check the config and build the model, then stop
    data_only: bool = False  # prepare the tokenizer and the packed sequences, print their folder, stop
    eval_after: bool = False  # fine-tune the fresh checkpoint with eval.py's recipe (cramming/sweep.py)
    eval_overrides: list[str] = field(default_factory=list)  # eval.py overrides for eval_after
    sweep_objective: str = "val_loss"  # what the run returns to a sweeper (glue_average needs eval_after)
    arch: ArchConfig = field(default_factory=ArchConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    impl: ImplConfig = field(default_factory=ImplConfig)

    RULES: ClassVar[dict] = {"budget": "> 0", "sweep_objective": ("val_loss", "glue_average")}


LATE_DEFAULTS = {"data.cache_dir": "${cramming_cache:}"}  # read at composition, not import
register("pretrain_schema", PretrainConfig, late=LATE_DEFAULTS)
