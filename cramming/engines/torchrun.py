"""Several processes started by torchrun: the process group, and agreeing on a few scalars (the budget clock, a
stop signal, a checkpoint being due), so every rank takes the same decisions. No other communication code of ours.

The global batch keeps its single-GPU meaning: train.batch_size = microbatch x accumulation x world size. Rank r
reads the r-th slice of each global microbatch, so the ranks together read exactly the rows (and, with position-
seeded masks, the masks) one process would read. Only rank 0 logs and writes files."""

import datetime
import os

import torch
import torch.distributed as dist

from .base import Engine


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def env_rank() -> int:
    """This process's rank as torchrun set it, before any process group exists (0 outside torchrun)."""
    return int(os.environ.get("RANK", "0"))


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


class Torchrun(Engine):
    """What every multi-process engine shares; not an engine by itself."""

    active = True
    whole_steps = True  # ranks agree on the clock once per optimizer step: all take the same microbatches

    @classmethod
    def join(cls, device_type: str) -> "Torchrun":
        """Join torchrun's process group: NCCL on GPUs, gloo on CPUs."""
        rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
        if device_type == "cuda":
            torch.cuda.set_device(local)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                                    timeout=datetime.timedelta(minutes=30))
        return cls(rank, world, local)

    def barrier(self) -> None:
        dist.barrier()

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        value = value.clone()
        dist.all_reduce(value)
        return value / self.world

    def agree(self, *values: float, device) -> list[float]:
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    def broadcast(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        """Leave the process group, once the run's parts are gone. A DDP wrapper must not outlive the group: its
        reducer would then hold gloo's last reference, and destroying that joins gloo's worker threads with the
        GIL held, while a worker may need the GIL to free the tensors of the last collective (a hang at exit, about
        one run in 13 on a loaded CPU). Dropped by Python, the group releases the GIL first: pretrain() leaves the
        group after the function holding the run's parts has returned."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def device(self, device: torch.device) -> torch.device:
        """Each rank drives its own GPU (torchrun's LOCAL_RANK)."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" else device
