"""Everything a run needs to continue exactly where it stopped, besides the model and optimizer tensors."""

import random
from dataclasses import asdict, dataclass, field

import numpy as np
import torch


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    sequences: int = 0  # consumed from the training stream: the data position
    elapsed: float = 0.0  # budget seconds spent in the training loop, over all resumes
    compile_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    skipped: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    skipped_in_row: int = 0
    rollbacks: int = 0
    lr_scale: float = 1.0  # lowered by each rollback
    last_loss: float = float("nan")
    untrained: dict = field(default_factory=dict)  # validation metrics before the first step
    energy_joules: float | None = 0.0  # measured by the launches up to this state, all ranks; None = not measurable

    def to_dict(self) -> dict:
        return asdict(self)


def capture_rng() -> dict:
    """Every random stream a step may draw from: Python, NumPy, torch (CPU and CUDA). Masks need none: they are
    seeded by their position in the data stream (masking.PositionalMasks)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(saved: dict) -> None:
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
