"""PyTorch's DistributedDataParallel: a whole replica per rank, gradients all-reduced in buckets."""

import torch

from .base import uncompiled
from .torchrun import Torchrun


class DDP(Torchrun):
    name = "ddp"

    def wrap(self, model, device: torch.device):
        from torch.nn.parallel import DistributedDataParallel

        # gradients live in the communication buckets: no second copy of them (16, not 20, bytes per parameter)
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=True)

    def no_sync(self, model, last_microbatch: bool):
        return super().no_sync(model, True) if last_microbatch else uncompiled(model).no_sync()
