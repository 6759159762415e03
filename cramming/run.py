"""A run's training parts, built from its config as pretrain() builds them, and one optimizer step over them.

pretrain() starts from build_run; so does anything that drives steps of its own (scripts/bench.py's sections,
scripts/bench_original.py), so what they time is what a run trains:

    run = build_run(config)                      # a PretrainConfig from cramming.validation.load_config
    loss = run.step(ids, generator)              # ids: (batch, seq) token ids; the objective masks or shifts them
    loss = run.update(run.objective.batch(ids))  # the same, the inputs made first (a benchmark's, outside its clock)
"""

from dataclasses import dataclass, field

import torch

from . import engines
from . import impl as impl_
from .config import PretrainConfig
from .data.tokenizer import SPECIAL_IDS
from .model import CrammedConfig
from .train.flops import forward_flops_per_token
from .train.fp8 import convert_to_fp8
from .train.init_from import load_source
from .train.microbatch import microbatch_size
from .train.objectives import OBJECTIVES, Objective, build_objective
from .train.optim import build_optimizer
from .train.recompute import recompute_blocks


def build_model(arch, vocab_size: int, special_ids: dict, runtime: impl_.Runtime):
    """The objective's Hugging Face model for `arch`, with the runtime's kernels named in its config. A causal
    config names its bos and eos ids as transformers' causal LMs do (the Trainer rewrites one that does not)."""
    config = CrammedConfig(
        **vars(arch),
        vocab_size=vocab_size,
        attention_impl=runtime.attention,
        rotary_impl=runtime.rotary,
        loss_impl=runtime.loss,
        pad_token_id=special_ids["pad"],
        cls_token_id=special_ids["cls"],
        sep_token_id=special_ids["sep"],
        mask_token_id=special_ids["mask"],
        causal=OBJECTIVES.trait(arch.objective, "causal"),
    )
    if config.causal:  # each training row opens with [CLS] and each document closes with [SEP] (data/prepare.py)
        config.bos_token_id, config.eos_token_id = special_ids["cls"], special_ids["sep"]
    return OBJECTIVES[arch.objective].head(config)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(model, config) -> int:
    sparse_mlm = OBJECTIVES.trait(config.arch.objective, "scores_masked_only") and config.arch.sparse_prediction
    return forward_flops_per_token(model, config.data.seq_length, config.train.mask_prob if sparse_mlm else 1.0)


def quiet(*args, **kwargs) -> None:
    """`say` for a run that prints nothing (a benchmark's, or a rank other than 0)."""


@dataclass
class Run:
    """What a training step needs. `model` is as the engine wrapped it (engine.unwrap(model) is the Hugging Face
    model, which checkpoints save); `step_model` is what a step calls, torch.compile's wrapper under impl.compile.
    `parameters` and `flops` (forward FLOPs per token) are counted on the dense model, before any float8 swap."""

    config: PretrainConfig
    runtime: impl_.Runtime
    engine: engines.Engine
    model: torch.nn.Module
    step_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    objective: Objective
    parameters: int
    flops: int
    fp8_layers: list[str] = field(default_factory=list)

    def step(self, ids: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One optimizer step on one batch of token ids, as the trainer takes a step of one microbatch: the
        objective's inputs (masked or shifted), then `update`. Returns the loss, detached."""
        return self.update(self.objective.batch(ids.to(self.runtime.device), generator))

    def update(self, inputs: dict) -> torch.Tensor:
        """One optimizer step on the objective's inputs: the forward under the run's autocast, the backward and
        the engine's clipped, checked update. Returns the loss, detached (a step whose loss or gradients are not
        finite is skipped, as train.nonfinite=skip)."""
        with self.runtime.autocast()():  # the runtime gives the context's factory
            loss = self.step_model(**inputs).loss
        self.engine.backward(self.model, loss, self.scaler)
        self.engine.step(self.model, self.optimizer, self.scaler, loss.detach(), self.config.train.grad_clip)
        return loss.detach()


def build_run(config: PretrainConfig, meta: dict | None = None, runtime: impl_.Runtime | None = None,
              engine: engines.Engine | None = None, tokenizer=None, source=None, say=quiet) -> Run:
    """The model (with train.init_from's weights from `source`), placed on its device under the engine (float8,
    activation checkpointing, the engine's wrapper), its optimizer and grad scaler, the compiled step model and the
    objective. `meta` is the prepared data's (its vocabulary and special ids); without it, the config's vocabulary
    and our tokenizer's special ids. `tokenizer` serves train.masking=whole-word."""
    runtime = runtime or impl_.resolve(config.impl, config.arch, documents=config.data.document_masking)
    engine = engine or engines.setup(config.impl.distributed, runtime.device.type)
    meta = meta or {"vocab_size": config.data.vocab_size, "special_ids": SPECIAL_IDS}
    model = build_model(config.arch, meta["vocab_size"], meta["special_ids"], runtime)
    if source is not None:
        load_source(model, source, config.train.init_from, config.arch)
        say(f"init_from: the weights of {source.folder} ({source.kind}); a new run: fresh optimizer, budget clock "
            "and schedule", flush=True)
    parameters, flops = count_parameters(model), flops_per_token(model, config)
    say(f"model: {parameters:,} parameters, {flops / 1e6:,.1f} MFLOPs per token forward (about 3x that to "
        f"train), device {runtime.device}, precision {runtime.precision}, compile {runtime.compile}, "
        f"attention {runtime.attention}, rotary {runtime.rotary}{engine.describe()}", flush=True)
    torch.manual_seed(config.seed + engine.rank)  # same initial weights everywhere, different dropout
    model, optimizer, scaler, converted = place(config, model, runtime, engine, say)
    objective = build_objective(config.arch.objective, config.train, meta, runtime.device, tokenizer,
                                documents=config.data.document_masking)
    step_model = engine.compile(model) if runtime.compile else model
    return Run(config, runtime, engine, model, step_model, optimizer, scaler, objective, parameters, flops, converted)


def place(config: PretrainConfig, model, runtime, engine, say=quiet):
    """The model on its device under the engine, with its optimizer and grad scaler, and the names of the layers
    that train in float8."""
    model.to(runtime.device)
    converted = []
    if runtime.precision == "fp8":  # before the engine, the compiler and the optimizer see the layers
        converted = convert_to_fp8(model, config.impl.fp8)
        say_fp8(converted, model, config.impl.fp8, say)
    if config.impl.activation_checkpointing:  # before the engine and the microbatch probe see it
        recompute_blocks(model)
    model = engine.wrap(model, runtime.device)  # before the optimizer: FSDP2 swaps the parameters
    optimizer = build_optimizer(model, config.train, runtime.device)
    return *engine.prepare(model, optimizer, config, runtime, microbatch_size(config)), converted


def say_fp8(converted: list[str], model, fp8, say) -> None:
    """One line: how many of the model's linear layers train in float8 (none: the run is bf16 throughout)."""
    total = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    if converted:
        say(f"fp8: {len(converted)} of {total} linear layers in float8 ({fp8.recipe} scaling), the rest in bf16",
            flush=True)
    else:
        say(f"note: impl.precision=fp8 but no layer has impl.fp8.min_elements={fp8.min_elements} weights with "
            "dims divisible by 16: the run is bf16 throughout", flush=True)
