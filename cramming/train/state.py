"""Everything a run needs to continue exactly where it stopped, besides the model and optimizer tensors."""

import pickle
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # NumPy 1
    from numpy.core.multiarray import _reconstruct


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
    seeded by their position in the data stream (masking.PositionalMasks). NumPy's key is kept as a tensor, so
    the file loads with weights_only=True."""
    kind, key, position, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(key.astype(np.int64)), position, has_gauss, gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(saved: dict) -> None:
    random.setstate(saved["python"])
    kind, key, *rest = saved["numpy"]
    np.random.set_state((kind, np.asarray(key).astype(np.uint32), *rest))  # a tensor, or an array (written before)
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])


# NumPy's arrays, which step folders written before the RNG state was kept as tensors hold; under both of the
# names NumPy 1 and 2 pickle them with. Their contents load through the same restricted unpickler.
NUMPY_ARRAYS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), *((_reconstruct, f"{module}.multiarray._reconstruct")
                                       for module in ("numpy.core", "numpy._core"))]


def _allowed_name(entry) -> str:
    return entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}"


def refuse_unsafe(path: Path) -> None:
    """One line, before anything else is done with it, when `path` would need more than weights_only allows:
    read from its pickle's names, nothing unpickled."""
    allowed = {_allowed_name(entry) for entry in NUMPY_ARRAYS}
    asks = [name for name in torch.serialization.get_unsafe_globals_in_checkpoint(path) if name not in allowed]
    if asks:
        raise UserError(f"{path} holds more than tensors and plain data (it asks for {', '.join(asks[:3])}), which "
                        "a step folder written by cramming never does; it was not loaded, as unpickling it could run "
                        "code: use a step folder you wrote, or the run's checkpoint/ folder")


def load_saved(path: Path) -> dict:
    """A step folder's state.pt or rng-<rank>.pt: tensors and plain data only (torch.load's weights_only), so a
    file from someone else cannot run code when it is read. Anything else is one line naming the file."""
    refuse_unsafe(path)
    with torch.serialization.safe_globals(NUMPY_ARRAYS):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:  # what the names did not show: refused all the same
            raise UserError(f"{path} could not be loaded with weights_only ({str(err).splitlines()[0][:200]}); "
                            "use a step folder you wrote, or the run's checkpoint/ folder") from None
