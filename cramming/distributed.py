"""More than one process: torchrun with PyTorch's DDP or FSDP2, or DeepSpeed (deepspeed_engine.py). No
communication code of our own beyond agreeing on a few scalars (the budget clock, a stop signal, a checkpoint
being due), so every rank takes the same decisions.

The global batch keeps its single-GPU meaning: train.batch_size = microbatch x accumulation x world size. Rank r
reads the r-th slice of each global microbatch, so the ranks together read exactly the rows (and, with position-
seeded masks, the masks) one process would read. Only rank 0 logs and writes files; checkpoints are written by
all ranks where the state is sharded (FSDP2, through torch.distributed.checkpoint) and by rank 0 otherwise.
"""

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import UserError

ENGINES = ("auto", "none", "ddp", "fsdp2", "deepspeed")


@dataclass
class Distributed:
    engine: str = "none"  # none | ddp | fsdp2 | deepspeed
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.engine != "none"

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a tensor over ranks (the step loss each rank computed on its slice)."""
        if self.active:
            value = value.clone()
            dist.all_reduce(value)
            value /= self.world
        return value

    def agree(self, *values: float, device) -> list[float]:
        """The largest of each value over ranks: the slowest clock, and any rank's stop flag, decide for all."""
        if not self.active:
            return [float(v) for v in values]
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def smallest(self, value: int, device) -> int:
        return -int(self.agree(-value, device=device)[0])  # the max of the negatives

    def broadcast(self, obj):
        """Rank 0's value of a picklable object on every rank (the run directory, for one)."""
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.active and dist.is_initialized():
            dist.destroy_process_group()


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def env_rank() -> int:
    """This process's rank as torchrun set it, before any process group exists (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


def setup(engine: str, device_type: str) -> Distributed:
    """Join torchrun's process group (NCCL on GPUs, gloo on CPUs); `auto` = ddp under torchrun, else none."""
    under_torchrun = launched_by_torchrun()
    if engine == "auto":
        engine = "ddp" if under_torchrun else "none"
    if engine == "none":
        if under_torchrun and int(os.environ["WORLD_SIZE"]) > 1:
            raise UserError("impl.distributed=none under torchrun with several processes would train the same "
                            "model several times; use impl.distributed=ddp or fsdp2")
        return Distributed()
    if not under_torchrun:
        raise UserError(f"impl.distributed={engine} needs torchrun to start the processes: "
                        f"torchrun --nproc_per_node=<gpus> pretrain.py ... (or impl.distributed=none)")
    if engine == "deepspeed":
        from .deepspeed_engine import require

        require()  # before any process group: a missing package is one line, not a hang on the other ranks
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if device_type == "cuda":
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=30))
    return Distributed(engine, rank, world, local)


def device_for(distributed: Distributed, device: torch.device) -> torch.device:
    """Each rank drives its own GPU (torchrun's LOCAL_RANK)."""
    if distributed.active and device.type == "cuda":
        return torch.device("cuda", distributed.local_rank)
    return device


def wrap(model, distributed: Distributed, device: torch.device):
    """DDP around the whole model, or FSDP2: `fully_shard` each block, then the root (embeddings and head)."""
    if distributed.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        # gradients live in the communication buckets: no second copy of them (16, not 20, bytes per parameter)
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=True)
    if distributed.engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in blocks_of(model):
            fully_shard(block)
        fully_shard(model)
    return model


def blocks_of(model) -> list:
    return list(getattr(model, model.base_model_prefix).layers)


def unwrap(model):
    """The module itself, under torch.compile, DDP and DeepSpeed (FSDP2 shards in place: no unwrapping)."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def gradient_sync(model, distributed: Distributed, last_microbatch: bool):
    """Accumulating microbatches: reduce gradients only on the last one, as the engines recommend."""
    if distributed.engine == "deepspeed":  # DeepSpeed reduces at the boundary we mark, before forward
        unwrap_compiled(model).set_gradient_accumulation_boundary(last_microbatch)
        return contextlib.nullcontext()
    if not distributed.active or last_microbatch:
        return contextlib.nullcontext()
    if distributed.engine == "ddp":
        return unwrap_compiled(model).no_sync()
    return _fsdp_no_sync(unwrap_compiled(model))


def unwrap_compiled(model):
    return getattr(model, "_orig_mod", model)


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_ over FSDP2's sharded parameters returns a DTensor; its value is the global norm."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def quiet_hydra_on_other_ranks(argv: list[str]) -> list[str]:
    """Under torchrun every rank runs pretrain.py, hence Hydra. Only rank 0 gets a run folder and Hydra's files;
    the others write nothing (and learn rank 0's folder once the process group is up)."""
    if env_rank() == 0:
        return argv
    quiet = ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled",
             "hydra.run.dir=."]
    # beside the other overrides: argparse takes them as one run of positional arguments
    position = next((i for i, a in enumerate(argv) if i and "=" in a and not a.startswith("-")), len(argv))
    return [*argv[:position], *quiet, *argv[position:]]
