"""DeepSpeed as an optional engine (impl.distributed=deepspeed, the [deepspeed] extra): ZeRO stages 0-2, bf16 or
fp16, gradient clipping through DeepSpeed's own `gradient_clipping`, and 1-bit Adam.

The budget loop stays ours: it decides the learning rate, the accumulation (so the batch ramp and the curriculum
work as under DDP), when to stop and when to checkpoint. DeepSpeed reduces the gradients at the boundary the loop
sets, clips, checks them for inf/NaN and steps. Our own optimizer (train.optim) is handed to DeepSpeed, which
shards its state under ZeRO; only 1-bit Adam is built by DeepSpeed itself.
"""

import contextlib
import importlib.util
import io
import logging
import warnings
from pathlib import Path

import torch

from ..errors import UserError
from ..impl import COMPILE_MODES
from ..registry import invalid, listed
from .base import uncompiled
from .torchrun import Torchrun

FOLDER = "deepspeed"  # inside a checkpoint: the engine's own files (weights, each rank's optimizer partition)
INSTALL = "pip install 'cramming[deepspeed]'"


def require():
    """The deepspeed module, or one line saying how to install it."""
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # its INFO lines would drown ours
    try:
        import deepspeed  # the optional [deepspeed] extra: only under impl.distributed=deepspeed
    except ImportError:
        raise UserError(f"impl.distributed=deepspeed needs DeepSpeed, which is not installed: {INSTALL}") from None
    # DeepSpeed's ZeRO still calls torch's renamed all_gather_into_tensor; nothing for a user to act on
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    return deepspeed


def has_onebit_adam() -> bool:
    return importlib.util.find_spec("deepspeed.runtime.fp16.onebit") is not None


def problem(config, runtime, microbatch: int | None) -> str | None:
    """What this DeepSpeed setup cannot do, in one line, before any work; None when it can run."""
    ds = config.impl.deepspeed
    if microbatch is None:
        return ("impl.microbatch_size=auto cannot be used with impl.distributed=deepspeed (DeepSpeed fixes the "
                "microbatch when the engine is built); give impl.microbatch_size a number")
    if ds.onebit_adam:
        deepspeed = require()
        if not has_onebit_adam():
            return (f"impl.deepspeed.onebit_adam: DeepSpeed {deepspeed.__version__} no longer has 1-bit Adam "
                    f"(removed in 0.19.7); pip install 'deepspeed<=0.19.6'")
        if runtime.device.type != "cuda":
            return ("impl.deepspeed.onebit_adam needs CUDA GPUs: 1-bit Adam's compressed all-reduce runs on NCCL "
                    "(and cupy); DeepSpeed has no CPU version of it")
    return None


def engine_config(config, runtime, microbatch: int, world: int) -> dict:
    """The DeepSpeed JSON config that our config means. The batch keys describe the full batch; the loop sets
    the accumulation boundary itself, so a batch ramp needs no engine rebuild."""
    ds, train = config.impl.deepspeed, config.train
    settings = {
        "train_batch_size": train.batch_size,
        "train_micro_batch_size_per_gpu": microbatch,
        "gradient_accumulation_steps": train.batch_size // (microbatch * world),
        "gradient_clipping": float(train.grad_clip or 0.0),  # 0 = off, DeepSpeed's convention
        "zero_optimization": {"stage": ds.zero_stage},
        "zero_allow_untested_optimizer": True,  # our optimizers (fused AdamW, Lion, ...) are ordinary torch ones
        "steps_per_print": 2**31 - 1,  # our metrics log reports; DeepSpeed's own would repeat it
    }
    if runtime.precision == "bf16":
        settings["bf16"] = {"enabled": True, "check_grad_overflow": True}
    elif runtime.precision == "fp16":
        settings["fp16"] = {"enabled": True}  # DeepSpeed's dynamic loss scaler replaces our GradScaler
    if ds.onebit_adam:
        settings["optimizer"] = {"type": "OneBitAdam", "params": {
            "lr": train.lr, "betas": list(train.betas), "eps": train.eps, "weight_decay": train.weight_decay,
            "freeze_step": ds.freeze_step, "comm_backend_name": "nccl"}}
    return settings


def initialize(model, optimizer, config, runtime, microbatch: int, distributed):
    """The engine and its optimizer. `optimizer` is ours (param groups carrying base_lr), unless 1-bit Adam is
    asked for: then DeepSpeed builds it over the same groups."""
    deepspeed = require()
    settings = engine_config(config, runtime, microbatch, distributed.world)
    if config.impl.deepspeed.onebit_adam:  # ours carry weight decay and base_lr; 1-bit Adam takes them over
        arguments = {"model_parameters": optimizer.param_groups}
    else:
        arguments = {"optimizer": optimizer}
    # DeepSpeed prints as it builds its kernels; the other ranks stay quiet, as everywhere else
    quiet = contextlib.nullcontext() if distributed.main else contextlib.redirect_stdout(io.StringIO())
    with quiet:
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=settings, **arguments)
    if config.impl.deepspeed.zero_stage > 0 and runtime.precision == "fp32":
        # ZeRO checks gradients for inf/NaN before stepping only in half precision by default; we want the
        # same guard in fp32, so train.nonfinite=skip means what it means without DeepSpeed.
        engine.optimizer.check_grad_overflow = True
    return engine, optimizer


def step(engine, step_loss: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Reduce, clip and step; returns the global gradient norm and whether the update counts as applied.
    DeepSpeed itself skips an update whose gradients hold inf/NaN. Under fp16 such skips are the loss scaler
    finding its scale (as with our GradScaler), so only a non-finite loss counts then."""
    plain = engine.zero_optimization_stage() == 0 and not (engine.fp16_enabled() or engine.bfloat16_enabled())
    if plain:  # DeepSpeed clips fp32 without ZeRO but keeps no norm: take it from the reduced gradients
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        plain_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    engine.step()
    finite = bool(torch.isfinite(step_loss))
    if not engine.fp16_enabled():
        finite = finite and engine.was_step_applied()
    norm = plain_norm if plain else engine.get_global_grad_norm()
    norm = torch.as_tensor(float("nan") if norm is None or not finite else float(norm))
    return norm, finite


def save(engine, folder: Path) -> None:
    """Every rank writes its part: the weights once, each rank's ZeRO partition of the optimizer state."""
    engine.save_checkpoint(str(folder), tag=FOLDER, save_latest=False)


def load(engine, folder: Path) -> None:
    path, _ = engine.load_checkpoint(str(folder), tag=FOLDER, load_optimizer_states=True,
                                     load_lr_scheduler_states=False)
    if path is None:
        raise UserError(f"{Path(folder) / FOLDER} could not be loaded by DeepSpeed (see the lines above)")


def full_weights(engine) -> dict[str, torch.Tensor]:
    """The whole model in fp32 on the CPU, from the optimizer's fp32 master copy where DeepSpeed keeps one
    (bf16/fp16), gathered from the ZeRO partitions. Collective: every rank must call it."""
    from deepspeed.utils import safe_get_full_fp32_param  # the optional extra, as in require()

    params = dict(engine.module.named_parameters())
    weights = {}
    for name, value in engine.module.state_dict().items():
        master = safe_get_full_fp32_param(params[name]) if name in params else None
        value = value if master is None else master
        weights[name] = value.detach().float().cpu() if value.is_floating_point() else value.cpu()
    return weights


class DeepSpeed(Torchrun):
    """DeepSpeed's ZeRO stages 0-2 under torchrun (the [deepspeed] extra), with its optional 1-bit Adam."""

    name = "deepspeed"
    state_folder = FOLDER
    same_world_to_resume = True  # each rank's ZeRO partition of the optimizer state is its own file
    shards_weights = True  # the fp32 master weights are partitioned by ZeRO

    @classmethod
    def join(cls, device_type: str) -> "DeepSpeed":
        require()  # before any process group: a missing package is one line, not a hang on the other ranks
        return super().join(device_type)

    @classmethod
    def settings_problem(cls, config) -> str | None:
        """impl.deepspeed's values, and, where DeepSpeed runs, what it refuses of the rest of the run."""
        ds, chosen = config.impl.deepspeed, config.impl.distributed
        if ds.zero_stage not in (0, 1, 2):
            return (f"impl.deepspeed.zero_stage={ds.zero_stage!r} is invalid: choose 0, 1 (optimizer state sharded) "
                    "or 2 (and gradients); stage 3 is what impl.distributed=fsdp2 does")
        if ds.freeze_step < 0:
            return f"impl.deepspeed.freeze_step={ds.freeze_step!r} is invalid: must be >= 0"
        if ds.onebit_adam and chosen != cls.name:
            return ("impl.deepspeed.onebit_adam=True is invalid: 1-bit Adam is DeepSpeed's; set "
                    "impl.distributed=deepspeed (or impl=deepspeed)")
        return cls.run_problem(config) if chosen == cls.name else None

    @classmethod
    def run_problem(cls, config) -> str | None:
        """DeepSpeed compiles the model itself, in torch's default mode; it casts the whole model to its own
        precision (bf16 / fp16), so no float8 layers; and its 1-bit Adam stands in for AdamW, without ZeRO."""
        from . import ENGINES  # the registry, whose module imports this one

        others = listed(sorted(name for name in ENGINES if name != cls.name))
        impl = config.impl
        if COMPILE_MODES[impl.compile_mode].torch_mode is not None:
            return invalid("impl.compile_mode", impl.compile_mode, "impl.distributed=deepspeed compiles the model "
                           f"itself, in torch's default mode; use impl.compile_mode=default or impl.distributed={others}")
        if impl.precision == "fp8":
            return invalid("impl.precision", "fp8", "impl.distributed=deepspeed runs the model in its own precision; "
                           f"use impl.distributed={others}, or impl.precision=bf16")
        if not impl.deepspeed.onebit_adam:
            return None
        if impl.deepspeed.zero_stage != 0:
            return ("impl.deepspeed.onebit_adam=True is invalid: DeepSpeed's 1-bit Adam does not combine with ZeRO; "
                    "set impl.deepspeed.zero_stage=0")
        if (name := config.train.optim.name) != "adamw":
            return (f"train.optim.name={name!r} is invalid: impl.deepspeed.onebit_adam replaces the optimizer with "
                    "1-bit Adam, which stands in for AdamW; leave train.optim.name=adamw")
        return None

    @classmethod
    def sliced_state_problem(cls, config) -> str | None:
        if config.impl.deepspeed.zero_stage == 0:
            return None
        return (f"train.optim.name={config.train.optim.name} cannot run under ZeRO: its update reads whole matrices "
                "(Muon orthogonalises them) and ZeRO gives each rank a slice of the optimizer state; use "
                "impl.deepspeed.zero_stage=0, or another optimizer")

    def nonfinite_checked(self, config, runtime) -> bool:
        """DeepSpeed checks the gradients for inf/NaN under ZeRO, or with fp16's loss scaler."""
        return config.impl.deepspeed.zero_stage > 0 or runtime.precision == "fp16"

    def unchecked_nonfinite_problem(self, config, policy: str, alternatives: list[str]) -> str:
        return (f"train.nonfinite={policy} needs DeepSpeed to check the gradients for inf/NaN, which it does under "
                "ZeRO (impl.deepspeed.zero_stage=1 or 2) or fp16 only; use one of those, or "
                f"train.nonfinite={'|'.join(alternatives)}")

    def problem(self, config, runtime, microbatch: int | None) -> str | None:
        return problem(config, runtime, microbatch) or super().problem(config, runtime, microbatch)

    def prepare(self, model, optimizer, config, runtime, microbatch: int):
        """The engine holds (and shards) the optimizer, and scales fp16 itself: our grad scaler stays off."""
        model, optimizer = initialize(model, optimizer, config, runtime, microbatch, self)
        return model, optimizer, torch.amp.GradScaler(runtime.device.type, enabled=False)

    def compile(self, model):
        model.compile()  # in place: the engine keeps its own methods (backward, step)
        return model

    def no_sync(self, model, last_microbatch: bool):
        """DeepSpeed reduces at the boundary we mark, before the forward pass."""
        uncompiled(model).set_gradient_accumulation_boundary(last_microbatch)
        return contextlib.nullcontext()

    def backward(self, model, loss: torch.Tensor, scaler) -> None:
        model.backward(loss, scale_wrt_gas=False)  # already divided by our accumulation

    def step(self, model, optimizer, scaler, step_loss: torch.Tensor, grad_clip) -> tuple[torch.Tensor, bool]:
        return step(model, step_loss)  # the module's step(): DeepSpeed reduces, clips and checks

    def save_state(self, model, optimizer, folder, saved: dict) -> None:
        save(model, folder)

    def load_state(self, model, optimizer, folder, saved: dict) -> None:
        load(model, folder)

    def whole_model(self, model, rebuild):
        """The fp32 master weights, gathered from the ZeRO partitions (collective: every rank calls it)."""
        weights = full_weights(model)
        return rebuild(weights) if self.main else None
