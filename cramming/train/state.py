"""Everything a run needs to continue exactly where it stopped, besides the model and optimizer tensors."""

import random
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError


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

    @classmethod
    def from_saved(cls, saved, path: Path) -> "TrainState":
        """The state a step folder's state.pt holds: a key this cramming does not know (a newer one wrote it) or a
        value of the wrong kind is one line naming the file, never a traceback."""
        known = {f.name: f for f in fields(cls)}
        if not isinstance(saved, dict):
            raise UserError(f"{path}: its trainer state is a {type(saved).__name__}, not a table; not a step folder "
                            "cramming wrote")
        unknown = sorted(set(saved) - set(known))
        if unknown:
            raise UserError(f"{path}: its trainer state has keys this cramming does not know ({', '.join(map(str, unknown[:3]))}); "
                            "a newer cramming wrote it: resume it with that version")
        numbers = {name for name, f in known.items() if f.type in (int, float, "int", "float")}
        bad = [k for k in numbers & set(saved) if not isinstance(saved[k], int | float) or isinstance(saved[k], bool)]
        if bad:
            raise UserError(f"{path}: its trainer state's {bad[0]} is {type(saved[bad[0]]).__name__}, not a number; "
                            "not a step folder cramming wrote")
        return cls(**saved)


def capture_rng() -> dict:
    """Every random stream a step may draw from: Python, NumPy, torch (CPU and CUDA). Masks need none: they are
    seeded by their position in the data stream (masking.PositionalMasks). NumPy's key is kept as a tensor, so
    the file loads with weights_only=True."""
    kind, key, position, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(key.astype(np.int64)), position, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def rng_problem(saved) -> str | None:
    """What makes a saved random state one capture_rng did not write (None when it is one): its parts, and each
    array of the size this Python, NumPy and torch use, so that restoring it allocates nothing beyond that."""
    if not isinstance(saved, dict) or not {"python", "numpy", "torch"} <= set(saved):
        return "it is not a table of the python, numpy and torch random states"
    python, numpy, cpu = saved["python"], saved["numpy"], saved["torch"]
    if not (isinstance(python, tuple | list) and len(python) == 3 and len(python[1]) == len(random.getstate()[1])):
        return "its Python random state is not one Python's random module keeps"
    if not (isinstance(numpy, tuple | list) and len(numpy) == 5 and len(numpy[1]) == 624):
        return "its NumPy random state is not NumPy's (a key of 624 numbers)"
    if not (isinstance(cpu, torch.Tensor) and cpu.dtype == torch.uint8 and cpu.shape == torch.get_rng_state().shape):
        return "its torch random state is not torch's CPU generator state"
    return None


def restore_rng(saved: dict) -> None:
    random.setstate(tuple(x if not isinstance(x, list) else tuple(x) for x in saved["python"]))
    kind, key, *rest = saved["numpy"]
    np.random.set_state((kind, np.asarray(key).astype(np.uint32), *rest))  # a tensor, or an array (written before)
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
