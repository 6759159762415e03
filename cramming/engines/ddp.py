"""PyTorch's DistributedDataParallel: a whole replica per rank, gradients all-reduced in buckets."""

import inspect

import torch
from torch.nn.parallel import DistributedDataParallel

from .base import uncompiled
from .torchrun import Torchrun


class DDP(Torchrun):
    """DistributedDataParallel under torchrun: a whole replica per rank, gradients all-reduced in buckets."""

    name = "ddp"

    def wrap(self, model, device: torch.device):
        # gradients live in the communication buckets: no second copy of them (16, not 20, bytes per parameter).
        # No buffer broadcast from rank 0 at each forward: our buffers are constants, or token dropping's importance,
        # whose update all-reduces every rank's losses (model/token_dropping.py), so the ranks already agree. Newer
        # torch (2.13) names that forward_sync_buffers=False and warns (FutureWarning) at broadcast_buffers; its one
        # broadcast at construction changes nothing, as the ranks agree.
        accepted = inspect.signature(DistributedDataParallel).parameters
        no_forward_sync = {"forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers": False}
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=True, **no_forward_sync)

    def no_sync(self, model, last_microbatch: bool):
        return super().no_sync(model, True) if last_microbatch else uncompiled(model).no_sync()
