"""How the training processes share one run (`impl.distributed`): one process, or torchrun's processes under DDP,
FSDP2 or DeepSpeed. One class per engine, each in its own file, registered here by name; the trainer, the
checkpointer and the recipe call the Engine interface (base.py) and never ask which engine they have. A new engine
is one file with its class, registered there (ENGINES.register(name)(cls)) and imported by one line below or by
$CRAMMING_PLUGINS (plugins.py)."""

import os

from ..config import ImplConfig
from ..errors import UserError
from ..registry import Registry
from .base import Engine
from .ddp import DDP
from .deepspeed import DeepSpeed
from .fsdp2 import FSDP2
from .torchrun import Torchrun, env_rank, launched_by_torchrun, quiet_hydra_on_other_ranks

ENGINES = Registry("distributed engine", ask=None, traits={  # asked once the world is known (Engine.problem)
    "shards_weights": "each process holds only part of the parameters (train.averaging refuses that)",
    "same_world_to_resume": "its checkpoint holds one state file per rank: resumed by the same world size only",
    "active": "several processes share the run",
    "whole_steps": "ranks agree on the clock once per optimizer step, so a step is never cut short by the budget",
})
ENGINES.serves(ImplConfig, "distributed")
for _engine in (Engine, DDP, FSDP2, DeepSpeed):
    ENGINES.register(_engine.name)(_engine)
CHOICES = ("auto", *ENGINES)  # impl.distributed; auto = ddp under torchrun, else none
UNDER_TORCHRUN = "ddp"  # what auto means under torchrun

__all__ = ["CHOICES", "ENGINES", "Engine", "Torchrun", "env_rank", "launched_by_torchrun",
           "quiet_hydra_on_other_ranks", "settings_problem", "setup"]


def settings_problem(config) -> str | None:
    """Each engine's own config block (impl.deepspeed, ...), checked when the config is loaded."""
    return next((p for engine in ENGINES.values() if (p := engine.settings_problem(config))), None)


def setup(name: str, device_type: str) -> Engine:
    """The engine `impl.distributed` names, joined to torchrun's process group where it needs one."""
    under_torchrun = launched_by_torchrun()
    if name == "auto":
        name = UNDER_TORCHRUN if under_torchrun else "none"
    engine = ENGINES.get_or_explain(name)
    if not issubclass(engine, Torchrun):
        if under_torchrun and int(os.environ["WORLD_SIZE"]) > 1:
            raise UserError(f"impl.distributed={name} under torchrun with several processes would train the same "
                            "model several times; use impl.distributed=ddp or fsdp2")
        return engine()
    if not under_torchrun:
        raise UserError(f"impl.distributed={name} needs torchrun to start the processes: "
                        f"torchrun --nproc_per_node=<gpus> pretrain.py ... (or impl.distributed=none)")
    return engine.join(device_type)
