"""PyTorch's FSDP2 (`fully_shard`): each block's parameters, gradients and optimizer state sharded over the ranks.
Checkpoints go through torch.distributed.checkpoint, every rank writing its shards into `sharded/`."""

import contextlib
from pathlib import Path

import torch

from .base import uncompiled
from .torchrun import Torchrun


def checkpointing():
    """torch.distributed.checkpoint and its state_dict helpers: about 1 s to import, so only when fsdp2 saves,
    loads or gathers (every engine's module is imported to register it)."""
    import torch.distributed.checkpoint as dcp  # ~1 s: only when fsdp2 checkpoints (the docstring above)
    import torch.distributed.checkpoint.state_dict as state  # (part of the same package)

    return dcp, state


def blocks_of(model) -> list:
    return list(getattr(model, model.base_model_prefix).layers)


class FSDP2(Torchrun):
    """FSDP2 (`fully_shard`) under torchrun: each block's weights, gradients and optimizer state sharded."""

    name = "fsdp2"
    state_folder = "sharded"
    shards_weights = True

    @classmethod
    def sliced_state_problem(cls, config) -> str | None:
        return (f"train.optim.name={config.train.optim.name} cannot run under impl.distributed=fsdp2: its update "
                "reads whole matrices (Muon orthogonalises them) and FSDP2 gives each rank a shard; use ddp, or "
                "another optimizer")

    def problem(self, config, runtime, microbatch: int | None) -> str | None:
        if runtime.precision == "fp16":
            return ("impl.precision=fp16 is not supported with impl.distributed=fsdp2 (its grad scaler would "
                    "see only this rank's shard); use bf16")
        if microbatch is None:
            return ("impl.microbatch_size=auto cannot probe a sharded model (every rank would have to fail "
                    "together); give impl.microbatch_size a number under impl.distributed=fsdp2")
        return super().problem(config, runtime, microbatch)

    def wrap(self, model, device: torch.device):
        """`fully_shard` each block, then the root (embeddings and head)."""
        from torch.distributed.fsdp import fully_shard  # ~1 s to import: only when fsdp2 runs

        for block in blocks_of(model):
            fully_shard(block)
        fully_shard(model)
        return model

    @contextlib.contextmanager
    def no_sync(self, model, last_microbatch: bool):
        model = uncompiled(model)
        if not last_microbatch:
            model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def global_norm(self, norm: torch.Tensor) -> torch.Tensor:
        """clip_grad_norm_ over sharded parameters returns a DTensor; its value is the global norm."""
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def save_state(self, model, optimizer, folder, saved: dict) -> None:
        dcp, state = checkpointing()
        model_state, optimizer_state = state.get_state_dict(self.unwrap(model), optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=Path(folder) / self.state_folder)

    def load_state(self, model, optimizer, folder, saved: dict) -> None:
        dcp, state = checkpointing()
        model = self.unwrap(model)
        model_state, optimizer_state = state.get_state_dict(model, optimizer)
        dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=Path(folder) / self.state_folder)
        state.set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)

    def whole_model(self, model, rebuild):
        """The shards gathered onto rank 0's CPU (collective: every rank calls it)."""
        _, state = checkpointing()
        options = state.StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = state.get_model_state_dict(self.unwrap(model), options=options)
        return rebuild(weights) if self.main else None
