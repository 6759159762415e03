"""The engine interface, and what one process does: nothing to share. Every engine is a subclass overriding only
what it does differently (Lightning's `Strategy`, torchtitan's parallelism components: the trainer never asks
which engine it has, it calls these methods)."""

import contextlib
import math

import torch

from ..errors import UserError
from ..impl import COMPILE_MODES, compile_note


def uncompiled(model):
    """The module torch.compile wrapped, or the model itself."""
    return getattr(model, "_orig_mod", model)


class Engine:
    """One process on one device: nothing shared (every other engine overrides only what it changes)."""

    name = "none"
    active = False  # several processes share the run
    state_folder = None  # the checkpoint's sub-folder holding this engine's own state files, if it has one
    # its traits (shards_weights, same_world_to_resume, whole_steps: ENGINES' declaration in engines/__init__.py)
    # are opt-in class attributes of the engines that have them
    compile_mode = "default"  # impl.compile_mode, learnt in prepare() for compile()

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0):
        self.rank, self.world, self.local_rank = rank, world, local_rank

    @property
    def main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        """For the model line: empty for one process."""
        return f", {self.name} on {self.world} processes" if self.active else ""

    # ---- what it refuses: its own settings and what it cannot run when the config is loaded, the run's when it
    # starts; the optimizer (Muon) and the non-finite policy ask it through the methods below
    @classmethod
    def settings_problem(cls, config) -> str | None:
        """The engine's own config block (impl.<name>), checked whichever engine is chosen, and what the engine
        refuses of the rest of the config where it is the one chosen."""
        return None

    @classmethod
    def sliced_state_problem(cls, config) -> str | None:
        """Why an optimizer whose update reads whole matrices (Muon) cannot run here, when this engine gives each
        rank a slice of the optimizer state; None when it keeps the state whole."""
        return None

    def nonfinite_checked(self, config, runtime) -> bool:
        """Whether every step's gradients are checked for inf/NaN, which train.nonfinite's policies that go on
        (skip, rollback) need."""
        return True

    def unchecked_nonfinite_problem(self, config, policy: str, alternatives: list[str]) -> str:
        return f"train.nonfinite={policy} needs every gradient checked for inf/NaN; use train.nonfinite=" \
               f"{'|'.join(alternatives)}"

    def problem(self, config, runtime, microbatch: int | None) -> str | None:
        batch = config.train.batch_size
        if batch % self.world:
            return (f"train.batch_size={batch} must be a multiple of the world size {self.world}: the global batch "
                    "keeps its meaning on any number of GPUs")
        if microbatch is not None and batch % (microbatch * self.world):
            return (f"train.batch_size={batch} must be a multiple of impl.microbatch_size x world size = "
                    f"{microbatch} x {self.world}: the global batch keeps its meaning on any number of GPUs")
        return None

    def check(self, config, runtime, microbatch: int | None) -> None:
        if problem := self.problem(config, runtime, microbatch):
            raise UserError(problem)

    # ---- agreeing on a few scalars: trivial alone
    def barrier(self) -> None:
        """Alone, there is no other rank to wait for."""

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a tensor over ranks (the step loss each rank computed on its slice)."""
        return value

    def agree(self, *values: float, device) -> list[float]:
        """The largest of each value over ranks: the slowest clock, and any rank's stop flag, decide for all."""
        return [float(v) for v in values]

    def smallest(self, value: int, device) -> int:
        return -int(self.agree(-value, device=device)[0])  # the max of the negatives

    def broadcast(self, obj):
        """Rank 0's value of a picklable object on every rank (the run directory, for one)."""
        return obj

    def close(self) -> None:
        """Alone, there is no process group to leave."""

    # ---- the model and its optimizer
    def device(self, device: torch.device) -> torch.device:
        return device

    def wrap(self, model, device: torch.device):
        """Before the optimizer is built (FSDP2 swaps the parameters)."""
        return model

    def prepare(self, model, optimizer, config, runtime, microbatch: int):
        """(model, optimizer, grad scaler) as the loop will use them."""
        self.learn_compile_mode(config, runtime)
        return model, optimizer, runtime.grad_scaler()

    def learn_compile_mode(self, config, runtime) -> None:
        """compile() is called with the model alone: the mode it passes on comes from the run's runtime here."""
        self.compile_mode = runtime.compile_mode
        if runtime.compile and self.main and (note := compile_note(config)):
            print(note, flush=True)

    def compile(self, model):
        """The module the loop calls (torch.compile's wrapper); checkpoints keep using `model`."""
        return torch.compile(model, mode=COMPILE_MODES[self.compile_mode].torch_mode)

    @staticmethod
    def unwrap(model):
        """The module itself, under torch.compile and any engine's wrapper (FSDP2 shards in place)."""
        model = uncompiled(model)
        return getattr(model, "module", model)

    # ---- one optimizer step
    def no_sync(self, model, last_microbatch: bool):
        """Accumulating microbatches: gradients are reduced only on the last one."""
        return contextlib.nullcontext()

    def backward(self, model, loss: torch.Tensor, scaler) -> None:
        scaler.scale(loss).backward()

    def step(self, model, optimizer, scaler, step_loss: torch.Tensor, grad_clip) -> tuple[torch.Tensor, bool]:
        """Clip, check, step. Returns the gradient norm and whether the update was applied (all finite).
        One host sync per step: the price of never applying a NaN. With fp16 the grad scaler owns non-finite
        gradients (it skips the step and lowers its scale), so only the loss is ours to check then."""
        scaler.unscale_(optimizer)
        grad_norm = self.global_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf))
        finite = torch.isfinite(step_loss)
        if not scaler.is_enabled():
            finite = finite & torch.isfinite(grad_norm)
        applied = bool(finite)  # the one sync
        if applied:
            scaler.step(optimizer)
        scaler.update()  # on every path: unscale_ above may run only once per update()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, applied

    def global_norm(self, norm: torch.Tensor) -> torch.Tensor:
        return norm

    # ---- checkpoints
    def save_state(self, model, optimizer, folder, saved: dict) -> None:
        """Model and optimizer state into `saved` (rank 0 writes it as state.pt), or the engine's own files."""
        saved.update(model=self.unwrap(model).state_dict(), optimizer=optimizer.state_dict())

    def load_state(self, model, optimizer, folder, saved: dict) -> None:
        self.unwrap(model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])

    def whole_model(self, model, rebuild):
        """The trained model in one piece, on rank 0, for the final checkpoint (None on other ranks).
        `rebuild(weights)` builds a fresh model from a full state dict, for engines that only hold parts."""
        return self.unwrap(model)
